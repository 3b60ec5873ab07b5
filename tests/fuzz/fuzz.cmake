# libFuzzer targets (issue 8), included from CMakeLists.txt when MTCFS_FUZZ=ON:
#   CC=clang cmake -S . -B build-fuzz -DMTCFS_FUZZ=ON && cmake --build build-fuzz --target fuzz
# The layer libraries get coverage instrumentation plus ASan+UBSan
# (fuzzer-no-link: no main, no libFuzzer runtime), so everything linking it
# is sanitized too; only the fuzz_<what> executables link libFuzzer itself.
# tests/fuzz/run.sh builds this and runs each target for a few seconds.
# (CMakeLists.txt includes this file unconditionally: one command per line.)
if(NOT MTCFS_FUZZ)
  return()
endif()
if(NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "MTCFS_FUZZ needs clang (libFuzzer): configure with CC=clang "
                      "(Debian: apt-get install clang libclang-rt-14-dev)")
endif()

set(MTCFS_FUZZ_SAN -fsanitize=address,undefined -fno-sanitize-recover=undefined
                   -fno-omit-frame-pointer)
foreach(layer ${MTCFS_LAYERS})
  target_compile_options(mtcfs_${layer} PRIVATE -fsanitize=fuzzer-no-link ${MTCFS_FUZZ_SAN})
  target_link_options(mtcfs_${layer} INTERFACE -fsanitize=address,undefined)
endforeach()

set(MTCFS_FUZZ_DIR ${CMAKE_SOURCE_DIR}/tests/fuzz)
set(MTCFS_FUZZ_TARGETS fuzz_replicator_yaml fuzz_peer_frame fuzz_manifest fuzz_gcs_json)
foreach(t ${MTCFS_FUZZ_TARGETS})
  add_executable(${t} ${MTCFS_FUZZ_DIR}/${t}.c)
  target_compile_options(${t} PRIVATE -fsanitize=fuzzer ${MTCFS_FUZZ_SAN})
  target_link_options(${t} PRIVATE -fsanitize=fuzzer,address,undefined)
  mtcfs_top_layer(${MTCFS_FUZZ_DIR}/${t}.c top)   # only the layers it includes
  target_link_libraries(${t} PRIVATE ${top})
  # Replays the seeds and every past finding once (no fuzzing): a finding
  # that comes back fails here, in the fuzz build's ctest.
  set(dirs ${MTCFS_FUZZ_DIR}/corpus/${t})
  if(EXISTS ${MTCFS_FUZZ_DIR}/regressions/${t})
    list(APPEND dirs ${MTCFS_FUZZ_DIR}/regressions/${t})
  endif()
  add_test(NAME fuzz.replay.${t}
           COMMAND ${t} -runs=0 -artifact_prefix=${CMAKE_BINARY_DIR}/${t}-replay- ${dirs})
endforeach()
target_link_libraries(fuzz_gcs_json PRIVATE PkgConfig::CURL)

# Writes the seed corpora (tests/fuzz/corpus/) from the real encoders:
#   build-fuzz/mtcfs-fuzz-seeds tests/fuzz/corpus
add_executable(mtcfs-fuzz-seeds ${MTCFS_FUZZ_DIR}/gen_seeds.c)
target_compile_options(mtcfs-fuzz-seeds PRIVATE ${MTCFS_FUZZ_SAN})
mtcfs_top_layer(${MTCFS_FUZZ_DIR}/gen_seeds.c top)
target_link_libraries(mtcfs-fuzz-seeds PRIVATE ${top})

add_custom_target(fuzz DEPENDS ${MTCFS_FUZZ_TARGETS} mtcfs-fuzz-seeds)
