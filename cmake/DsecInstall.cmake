# `cmake --install build [--prefix P]`: where a Slurm admin expects dsec's parts.
#   bin/dsec, bin/dsec-launch                     the CLI and the fleet launcher (run under srun/mpirun)
#   libexec/dsec/dsec-sandbox-init, -spawner      found there by the backend (../libexec/dsec from bin/)
#   libexec/dsec/dsec-qos-probe                   what `dsec bench qos` runs inside its sandboxes
#   libexec/dsec/dsec-guest-agent                 PID 1 of microvm/vm guests (found there by backends/vm)
#   libexec/dsec/fetch-guest-kernel.sh            installs the guest kernel (/usr/local/lib/dsec/guest-kernel)
#   DSEC_SPANK_PLUGIN_DIR/spank_dsec.so           with its own dsec-sandbox-init beside it (the plugin's first
#                                                 choice: slurmstepd's directory has no libexec/dsec)
#   DSEC_PYTHON_SITEDIR/pydsec                    the SDK (standard library only)
#   share/dsec/slurm-configs                      slurm.conf and plugstack.conf snippets, sbatch/srun examples
include(GNUInstallDirs)

set(DSEC_SPANK_PLUGIN_DIR "${CMAKE_INSTALL_LIBDIR}/dsec" CACHE STRING
    "where spank_dsec.so goes (relative to the prefix, or absolute, e.g. /usr/lib/x86_64-linux-gnu/slurm-wlm)")

# The prefix's Python package directory: the first of site.getsitepackages() under the prefix (Debian:
# /usr/local/lib/python3.X/dist-packages for /usr/local), else lib/python3/dist-packages under it.
if(NOT DEFINED DSEC_PYTHON_SITEDIR)
  # The distribution's python3 (what pydsec's users run), not whatever python3 is first on the builder's PATH.
  find_program(DSEC_SYSTEM_PYTHON3 python3 PATHS /usr/bin NO_DEFAULT_PATH)
  if(NOT DSEC_SYSTEM_PYTHON3)
    find_program(DSEC_SYSTEM_PYTHON3 python3)
  endif()
  set(site_dir "")
  if(DSEC_SYSTEM_PYTHON3)
    execute_process(
      COMMAND ${DSEC_SYSTEM_PYTHON3} -c
              "import site, sys; p = sys.argv[1].rstrip('/') + '/'; print(next((d for d in site.getsitepackages() if d.startswith(p)), ''))"
              "${CMAKE_INSTALL_PREFIX}"
      OUTPUT_VARIABLE site_dir OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  endif()
  if(site_dir STREQUAL "")
    set(site_dir "${CMAKE_INSTALL_LIBDIR}/python3/dist-packages")
  endif()
  set(DSEC_PYTHON_SITEDIR "${site_dir}" CACHE STRING "where the pydsec package goes")
endif()

install(TARGETS dsec RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
if(TARGET dsec-launch)
  install(TARGETS dsec-launch RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
install(TARGETS dsec-sandbox-init dsec-sandbox-spawner dsec-qos-probe dsec-guest-agent
        RUNTIME DESTINATION ${CMAKE_INSTALL_LIBEXECDIR}/dsec)
install(PROGRAMS ${PROJECT_SOURCE_DIR}/backends/vm/guest/fetch-guest-kernel.sh DESTINATION ${CMAKE_INSTALL_LIBEXECDIR}/dsec)
if(TARGET spank_dsec)
  install(TARGETS spank_dsec LIBRARY DESTINATION ${DSEC_SPANK_PLUGIN_DIR})
  install(PROGRAMS $<TARGET_FILE:dsec-sandbox-init> DESTINATION ${DSEC_SPANK_PLUGIN_DIR})
endif()
install(DIRECTORY ${PROJECT_SOURCE_DIR}/pydsec/pydsec DESTINATION ${DSEC_PYTHON_SITEDIR}
        PATTERN "__pycache__" EXCLUDE PATTERN "*.pyc" EXCLUDE)
install(DIRECTORY ${PROJECT_SOURCE_DIR}/slurm-configs/ DESTINATION ${CMAKE_INSTALL_DATADIR}/dsec/slurm-configs)
