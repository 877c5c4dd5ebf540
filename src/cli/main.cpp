#include <exception>
#include <iostream>

#include "cli/commands.h"
#include "core/check.h"

namespace flashmap::cli {

std::vector<RegisterFn>& command_registry() {
  static std::vector<RegisterFn> registry;
  return registry;
}

}  // namespace flashmap::cli

int main(int argc, char** argv) {
  CLI::App app{"flashmap: lossless speculative decoding with FlashMap drafters"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "flashmap 0.1.0");
  for (auto fn : flashmap::cli::command_registry()) fn(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::RuntimeError& e) {
    return app.exit(e);  // a command's silent exit with its own status (commands.h)
  } catch (const CLI::ParseError& e) {
    // --help and --version arrive here with status 0. Anything else is a bad command line (an
    // unknown option, a value that does not convert or is out of range): one line and status
    // 1, like every other input error, rather than CLI11's codes 101-127 and two lines.
    if (e.get_exit_code() == 0) return app.exit(e);
    std::cerr << "flashmap: error: " << e.what() << " (see --help)\n";
    return 1;
  } catch (const flashmap::Error& e) {
    std::cerr << "flashmap: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "flashmap: internal error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
