// The checks that throw flashmap's errors (include/flashmap/errors.h) with a formatted message.
#pragma once

#include <flashmap/errors.h>
#include <fmt/format.h>

#define FLASHMAP_CHECK(cond, ...)                                   \
  do {                                                              \
    if (!(cond)) throw ::flashmap::Error(fmt::format(__VA_ARGS__)); \
  } while (0)

#define FLASHMAP_CHECK_PARAM(cond, param, ...)                                    \
  do {                                                                            \
    if (!(cond)) throw ::flashmap::ParamError((param), fmt::format(__VA_ARGS__)); \
  } while (0)

#define FLASHMAP_ASSERT(cond)                                                    \
  do {                                                                           \
    if (!(cond))                                                                 \
      throw ::flashmap::InternalError(                                           \
          fmt::format("internal error: {} ({}:{})", #cond, __FILE__, __LINE__)); \
  } while (0)
