# cmake -DBUILD_DIR=... -DSOURCE_DIR=... -DCXX_COMPILER=... -DGENERATOR=... [-DCUDA_ROOT=...]
#       -P install_test.cmake
# Installs BUILD_DIR into a temporary prefix, moves the prefix (a binary or package holding a path
# into the build, source or first install tree then finds nothing there), and checks from a
# working directory outside both trees, with FLASHMAP_HOME unset:
#   - bin/flashmap generate on its default pair gives the ids of the build tree's flashmap on the
#     source tree's models/default;
#   - the same binary without share/flashmap/models fails naming the installed folder only (no
#     fallback to the source tree), and FLASHMAP_HOME points it at a pair again;
#   - a project under consumer/ built with find_package(flashmap) against the moved prefix
#     decodes the same prompt to the same ids.
cmake_minimum_required(VERSION 3.25)
foreach(var BUILD_DIR SOURCE_DIR CXX_COMPILER GENERATOR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "install_test.cmake: -D${var}=... is required")
  endif()
endforeach()

if(DEFINED ENV{TMPDIR} AND IS_DIRECTORY "$ENV{TMPDIR}")
  set(tmp_root "$ENV{TMPDIR}")
else()
  set(tmp_root /tmp)
endif()
string(RANDOM LENGTH 10 suffix)
set(WORK ${tmp_root}/flashmap-install-test-${suffix})
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK}/cwd)
unset(ENV{FLASHMAP_HOME})

# Paths inside regular expressions.
function(regex_escape out_var text)
  string(REGEX REPLACE "([][+.*()^$?|\\\\])" "\\\\\\1" escaped "${text}")
  set(${out_var} "${escaped}" PARENT_SCOPE)
endfunction()

function(fail what)
  message(FATAL_ERROR "install.package: ${what}\n(files left in ${WORK})")
endfunction()

# run(<out_var> <rc_var> cmd...): runs cmd in WORK/cwd, stdout in out_var, stderr appended.
function(run out_var rc_var)
  execute_process(COMMAND ${ARGN} WORKING_DIRECTORY ${WORK}/cwd RESULT_VARIABLE rc
                  OUTPUT_VARIABLE out ERROR_VARIABLE err)
  set(${out_var} "${out}" PARENT_SCOPE)
  set(${rc_var} "${rc}" PARENT_SCOPE)
  set(last_stderr "${err}" PARENT_SCOPE)
endfunction()

# The ids of one greedy `EXE generate --json [args...]` run, as a list.
function(generate_ids out_var exe)
  run(out rc ${exe} generate --prompt ab --max-new-tokens 12 --temperature 0 --json ${ARGN})
  if(NOT rc EQUAL 0)
    fail("${exe} generate ${ARGN} exited with ${rc}: ${last_stderr}")
  endif()
  string(JSON n ERROR_VARIABLE jerr LENGTH "${out}" ids)
  if(jerr)
    fail("${exe} generate ${ARGN} printed no ids (${jerr}): ${out}")
  endif()
  set(ids)
  math(EXPR last "${n} - 1")
  foreach(i RANGE ${last})
    string(JSON id GET "${out}" ids ${i})
    list(APPEND ids ${id})
  endforeach()
  set(${out_var} "${ids}" PARENT_SCOPE)
endfunction()

# Install, then move the prefix.
run(out rc ${CMAKE_COMMAND} --install ${BUILD_DIR} --prefix ${WORK}/staged)
if(NOT rc EQUAL 0)
  fail("cmake --install exited with ${rc}: ${out}${last_stderr}")
endif()
file(RENAME ${WORK}/staged ${WORK}/prefix)
set(P ${WORK}/prefix)
foreach(f bin/flashmap share/flashmap/models/default/target/config.json
          share/flashmap/models/default/target/tokenizer.json
          share/flashmap/models/default/draft/model.safetensors include/flashmap/engine.h)
  if(NOT EXISTS ${P}/${f})
    fail("${f} is not installed")
  endif()
endforeach()
file(GLOB_RECURSE config ${P}/*/flashmapConfig.cmake)
if(NOT config)
  fail("no flashmapConfig.cmake installed")
endif()
# The installed headers include each other and the standard library only.
file(GLOB headers ${P}/include/flashmap/*.h)
foreach(h IN LISTS headers)
  file(STRINGS ${h} includes REGEX "^#include")
  foreach(line IN LISTS includes)
    if(NOT line MATCHES "^#include <(flashmap/[a-z_]+\\.h|nlohmann/json\\.hpp|[a-z_]+)>")
      fail("${h} has ${line}, which is not part of the installed package")
    endif()
  endforeach()
endforeach()

# The reference: the build tree's binary on the source tree's pair.
set(pair ${SOURCE_DIR}/models/default)
generate_ids(expected ${BUILD_DIR}/flashmap --target ${pair}/target --draft ${pair}/draft)
list(LENGTH expected n_expected)
if(n_expected EQUAL 0)
  fail("the build tree's flashmap generated no ids")
endif()

generate_ids(installed ${P}/bin/flashmap)
if(NOT installed STREQUAL expected)
  fail("installed flashmap: ids ${installed}, the build tree's: ${expected}")
endif()

# Without its models the installed binary has no default, whatever the source tree holds.
file(COPY ${P}/bin DESTINATION ${WORK}/bare)
run(out rc ${WORK}/bare/bin/flashmap generate --prompt ab --max-new-tokens 2)
regex_escape(bare_pair ${WORK}/bare/share/flashmap/models/default)
if(rc EQUAL 0 OR NOT last_stderr MATCHES "no default model pair \\(looked in ${bare_pair}\\);")
  fail("bin/flashmap without share/flashmap: exit ${rc}, ${last_stderr}")
endif()
set(ENV{FLASHMAP_HOME} ${P}/share/flashmap)
generate_ids(home ${WORK}/bare/bin/flashmap)
unset(ENV{FLASHMAP_HOME})
if(NOT home STREQUAL expected)
  fail("FLASHMAP_HOME=${P}/share/flashmap: ids ${home}, expected ${expected}")
endif()

# A project built against the moved prefix alone.
set(configure_args -S ${SOURCE_DIR}/tests/install/consumer -B ${WORK}/consumer -G ${GENERATOR}
    -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_PREFIX_PATH=${P}
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
if(DEFINED CUDA_ROOT)
  list(APPEND configure_args -DCUDAToolkit_ROOT=${CUDA_ROOT})
endif()
run(out rc ${CMAKE_COMMAND} ${configure_args})
if(NOT rc EQUAL 0)
  fail("configuring the consumer exited with ${rc}: ${out}${last_stderr}")
endif()
regex_escape(prefix_re ${P})
if(NOT out MATCHES "flashmap_DIR=${prefix_re}/")
  fail("the consumer found a flashmap package outside the prefix: ${out}")
endif()
run(out rc ${CMAKE_COMMAND} --build ${WORK}/consumer)
if(NOT rc EQUAL 0)
  fail("building the consumer exited with ${rc}: ${out}${last_stderr}")
endif()
run(out rc ${WORK}/consumer/consumer ${P}/share/flashmap/models/default ab 12)
if(NOT rc EQUAL 0)
  fail("the consumer exited with ${rc}: ${out}${last_stderr}")
endif()
string(REPLACE ";" " " expected_line "${expected}")
if(NOT out MATCHES "(^|\n)prompt 412\n" OR NOT out MATCHES "\nids ${expected_line}\n")
  fail("the consumer printed\n${out}\nexpected prompt 412 and ids ${expected_line}")
endif()

file(REMOVE_RECURSE ${WORK})
message(STATUS "install.package: installed flashmap and a consumer of its package decode ${expected_line}")
