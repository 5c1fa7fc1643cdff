// The subcommands of `dsec`, one file each (Cmd<Name>.cc); Main.cc maps names to them.
#pragma once

#include "Cli.h"

namespace dsec::cli {

int cmdServe(const Invocation& inv);
int cmdRun(const Invocation& inv);
int cmdExec(const Invocation& inv);
int cmdShell(const Invocation& inv);
int cmdCall(const Invocation& inv);
int cmdLs(const Invocation& inv);
int cmdRm(const Invocation& inv);
int cmdPause(const Invocation& inv);
int cmdResume(const Invocation& inv);
int cmdNetwork(const Invocation& inv);
int cmdProtect(const Invocation& inv);
int cmdViolations(const Invocation& inv);
int cmdLayer(const Invocation& inv);     // build | ls | rm
int cmdSnapshot(const Invocation& inv);  // create | ls | rm
int cmdFork(const Invocation& inv);
int cmdDoctor(const Invocation& inv);
int cmdNode(const Invocation& inv);   // cleanup --job ID
int cmdBench(const Invocation& inv);  // create | density

}  // namespace dsec::cli
