// Each `flashmap` subcommand lives in its own cmd_*.cpp and registers itself here through
// FLASHMAP_COMMAND, so adding a command touches no other file. A command adds a CLI11
// subcommand and sets its callback; flashmap::Error thrown from the callback becomes a one-line
// message and exit status 1, CLI::RuntimeError(n) a silent exit with status n.
#pragma once

#include <CLI/CLI.hpp>
#include <vector>

namespace flashmap::cli {

using RegisterFn = void (*)(CLI::App& app);

std::vector<RegisterFn>& command_registry();

}  // namespace flashmap::cli

#define FLASHMAP_COMMAND(fn) \
  static const bool fn##_registered = (::flashmap::cli::command_registry().push_back(&fn), true)
