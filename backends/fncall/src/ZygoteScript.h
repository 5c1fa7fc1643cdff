// The zygote (zygote.py), compiled in: started as `python3 -B -c kZygoteScript <language>`.
#pragma once

namespace dsec::backends::fncall {

extern const char kZygoteScript[];

}  // namespace dsec::backends::fncall
