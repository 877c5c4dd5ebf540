# cmake -DCXX=... -DHEADER=engine.h -DINCLUDE_DIR=.../include -DWORK_DIR=... -P header_alone.cmake
#
# 1. A file that includes <flashmap/HEADER> (twice: it must be idempotent) and nothing else
#    compiles with -I INCLUDE_DIR alone: a header including one of src/ fails here.
# 2. Every file that compilation reads is a public header, part of the standard library (what a
#    file including every C++20 standard header reads), or a third-party header the public
#    interface is written in (below): fmt, say, lives in /usr/include beside the C library, so
#    the compiler alone would find it.
foreach(var CXX HEADER INCLUDE_DIR WORK_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "header_alone.cmake: -D${var}=... missing")
  endif()
endforeach()

# Third-party headers a public header may read, by header: ChatTemplate::render() takes a JSON
# request, and TextCodec's chat requests are JSON too.
set(allowed_chat.h nlohmann/json.hpp)
set(allowed_text.h nlohmann/json.hpp)

set(std_headers
    algorithm any array atomic barrier bit bitset cassert cctype cerrno cfenv cfloat charconv
    chrono cinttypes climits clocale cmath codecvt compare complex concepts condition_variable
    coroutine csetjmp csignal cstdarg cstddef cstdint cstdio cstdlib cstring ctime cuchar cwchar
    cwctype deque exception execution filesystem format forward_list fstream functional future
    initializer_list iomanip ios iosfwd iostream istream iterator latch limits list locale map
    memory memory_resource mutex new numbers numeric optional ostream queue random ranges ratio
    regex scoped_allocator semaphore set shared_mutex source_location span sstream stack
    stdexcept stop_token streambuf string string_view syncstream system_error thread tuple
    type_traits typeindex typeinfo unordered_map unordered_set utility valarray variant vector
    version)

file(MAKE_DIRECTORY ${WORK_DIR})
set(flags -std=c++20 -I ${INCLUDE_DIR})

# The files a translation unit reads, as real paths.
function(dependencies source out)
  execute_process(COMMAND ${CXX} ${flags} -M ${source} RESULT_VARIABLE rc OUTPUT_VARIABLE deps
                  ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${CXX} -M ${source} failed:\n${err}")
  endif()
  string(REPLACE "\\\n" " " deps "${deps}")
  separate_arguments(deps UNIX_COMMAND "${deps}")
  list(POP_FRONT deps)  # the make target ("x.o:")
  set(paths)
  foreach(d ${deps})
    if(NOT d STREQUAL source)
      file(REAL_PATH ${d} real)
      list(APPEND paths ${real})
    endif()
  endforeach()
  set(${out} ${paths} PARENT_SCOPE)
endfunction()

set(alone ${WORK_DIR}/alone.cpp)
file(WRITE ${alone} "#include <flashmap/${HEADER}>\n#include <flashmap/${HEADER}>\n")
execute_process(COMMAND ${CXX} ${flags} -fsyntax-only -Wall -Wextra -Werror ${alone}
                RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "<flashmap/${HEADER}> does not compile alone with only -I ${INCLUDE_DIR}:\n"
                      "${err}")
endif()

set(reference ${WORK_DIR}/standard.cpp)
set(text "")
foreach(h ${std_headers} ${allowed_${HEADER}})
  string(APPEND text "#if __has_include(<${h}>)\n#include <${h}>\n#endif\n")
endforeach()
file(WRITE ${reference} "${text}")
dependencies(${reference} known)
dependencies(${alone} used)

file(REAL_PATH ${INCLUDE_DIR}/flashmap public_dir)
set(bad)
foreach(f ${used})
  string(FIND "${f}" "${public_dir}/" at)
  if(at EQUAL 0)
    continue()
  endif()
  list(FIND known "${f}" found)
  if(found LESS 0)
    list(APPEND bad ${f})
  endif()
endforeach()
if(bad)
  list(JOIN bad "\n  " bad)
  message(FATAL_ERROR "<flashmap/${HEADER}> reads files that are neither public headers nor the "
                      "standard library:\n  ${bad}")
endif()
