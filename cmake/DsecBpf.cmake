# BPF programs: compiled with clang for the bpf target and embedded in the binary as a libbpf skeleton header
# (<name>.skel.h), so nothing is read from disk at run time. Programs use only UAPI headers (no vmlinux.h), so
# the build does not depend on the build host's kernel.
find_program(DSEC_CLANG clang REQUIRED)
find_program(DSEC_BPFTOOL bpftool PATHS /usr/sbin /sbin REQUIRED)
pkg_check_modules(LIBBPF REQUIRED IMPORTED_TARGET libbpf)

# dsec_bpf_skeleton(TARGET NAME SOURCE): builds SOURCE into NAME.bpf.o and NAME.skel.h, which TARGET includes.
function(dsec_bpf_skeleton target name source)
  set(dir ${CMAKE_CURRENT_BINARY_DIR}/bpf)
  set(object ${dir}/${name}.bpf.o)
  set(skeleton ${dir}/${name}.skel.h)
  set(arch_include /usr/include/${CMAKE_LIBRARY_ARCHITECTURE})
  add_custom_command(
    OUTPUT ${skeleton}
    COMMAND ${CMAKE_COMMAND} -E make_directory ${dir}
    COMMAND ${DSEC_CLANG} -g -O2 -Wall -Werror -target bpf -I${arch_include} -MD -MF ${object}.d -MT ${skeleton}
            -c ${CMAKE_CURRENT_SOURCE_DIR}/${source} -o ${object}
    COMMAND sh -c "${DSEC_BPFTOOL} gen skeleton ${object} name ${name} > ${skeleton}.tmp && mv ${skeleton}.tmp ${skeleton}"
    DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/${source}
    DEPFILE ${object}.d  # the headers it includes (map layouts, the shared egress decision)
    COMMENT "BPF ${name}"
    VERBATIM)
  add_custom_target(${name}_skeleton DEPENDS ${skeleton})
  add_dependencies(${target} ${name}_skeleton)
  target_include_directories(${target} PRIVATE ${dir})
  target_link_libraries(${target} PUBLIC PkgConfig::LIBBPF)
endfunction()
