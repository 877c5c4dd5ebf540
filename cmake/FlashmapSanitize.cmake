# Sanitizer and fuzzing builds (docs/TESTING.md). Both are off by default, so the default build is
# unchanged.
#
# FLASHMAP_SANITIZE=address,undefined: AddressSanitizer and UndefinedBehaviorSanitizer, every
#   report fatal (-fno-sanitize-recover=all).
# FLASHMAP_SANITIZE_STL=ON (with either): libstdc++'s own checks as well (_GLIBCXX_ASSERTIONS:
#   vector, string_view and span indexing, front/back of empty containers), which see what ASan
#   cannot: an index past a vector's size but inside its capacity, or a pointer formed past the
#   end with operator[] (docs/TESTING.md lists what it still finds outside the parsers).
# FLASHMAP_SANITIZE=thread: ThreadSanitizer.
# FLASHMAP_FUZZ=ON (clang, with address,undefined): every library is also instrumented for
#   libFuzzer's coverage (-fsanitize=fuzzer-no-link), so that the harnesses in tests/fuzz link the
#   same objects as the tests of this build; the test binaries run as usual (the sanitizer runtime
#   gives the coverage hooks no-op definitions).
set(FLASHMAP_SANITIZE "" CACHE STRING "Sanitizers: address,undefined | thread | empty for none")
set_property(CACHE FLASHMAP_SANITIZE PROPERTY STRINGS "" "address,undefined" "thread")
option(FLASHMAP_FUZZ "Build the libFuzzer harnesses in tests/fuzz (clang, FLASHMAP_SANITIZE=address,undefined)" OFF)
option(FLASHMAP_SANITIZE_STL "With FLASHMAP_SANITIZE: libstdc++'s assertions too" OFF)

if(FLASHMAP_SANITIZE STREQUAL "address,undefined")
  add_compile_options(-fsanitize=address,undefined -fno-sanitize-recover=all
                      -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined -fno-sanitize-recover=all)
elseif(FLASHMAP_SANITIZE STREQUAL "thread")
  add_compile_options(-fsanitize=thread -fno-omit-frame-pointer)
  add_link_options(-fsanitize=thread)
elseif(NOT FLASHMAP_SANITIZE STREQUAL "")
  message(FATAL_ERROR "FLASHMAP_SANITIZE='${FLASHMAP_SANITIZE}': expected address,undefined, thread "
                      "or empty")
endif()
if(FLASHMAP_SANITIZE_STL)
  add_compile_definitions(_GLIBCXX_ASSERTIONS)
endif()
if(NOT FLASHMAP_SANITIZE STREQUAL "")
  if(FLASHMAP_CUDA STREQUAL "ON")
    message(FATAL_ERROR "FLASHMAP_SANITIZE builds the CPU tree only: configure with -DFLASHMAP_CUDA=OFF")
  endif()
  # nvcc takes none of these flags, and the sanitizers see nothing of the device.
  set(FLASHMAP_CUDA OFF CACHE STRING "Build the CUDA backend (src/cuda): AUTO, ON or OFF" FORCE)
  message(STATUS "flashmap: sanitizers ${FLASHMAP_SANITIZE}")
endif()

if(FLASHMAP_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "FLASHMAP_FUZZ needs clang (libFuzzer): configure with "
                        "-DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang")
  endif()
  if(NOT FLASHMAP_SANITIZE STREQUAL "address,undefined")
    message(FATAL_ERROR "FLASHMAP_FUZZ needs -DFLASHMAP_SANITIZE=address,undefined")
  endif()
  add_compile_options(-fsanitize=fuzzer-no-link)
endif()
