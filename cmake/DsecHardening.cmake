# Hardening for every target. The SPANK plugin runs as root inside slurmstepd and links all of our static
# libraries, and the agent handles hostile input, so nothing is built without these: stack protector and
# stack-clash probes, control-flow protection, fortified libc calls (optimised builds only: glibc's checks
# need optimisation), full RELRO with immediate binding, and a non-executable stack.
include(CheckCXXCompilerFlag)
foreach(flag -fstack-protector-strong -fstack-clash-protection -fcf-protection=full)
  string(MAKE_C_IDENTIFIER "DSEC_HAS${flag}" have)
  check_cxx_compiler_flag(${flag} ${have})
  if(${have})
    add_compile_options(${flag})
  endif()
endforeach()
add_compile_options("$<$<NOT:$<CONFIG:Debug>>:-U_FORTIFY_SOURCE;-D_FORTIFY_SOURCE=2>")
add_link_options(LINKER:-z,relro LINKER:-z,now LINKER:-z,noexecstack)
