// The host's Debian mirror, for debootstrap when none is given (internal).
#pragma once

#include <string>

namespace dsec::fs3 {

// The first http(s) archive URL whose path ends in /debian (else the first at all; -security ones never) of a
// `deb` entry in <etc_apt>/sources.list, then
// <etc_apt>/sources.list.d/*.list and *.sources (deb822 `URIs:`), in name order; "" if there is none.
std::string hostAptMirror(const std::string& etc_apt = "/etc/apt");

}  // namespace dsec::fs3
