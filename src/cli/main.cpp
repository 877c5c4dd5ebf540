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
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const flashmap::Error& e) {
    std::cerr << "flashmap: error: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "flashmap: internal error: " << e.what() << "\n";
    return 2;
  }
  return 0;
}
