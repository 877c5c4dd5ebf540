// `flashmap convert`: a training tool's drafter checkpoint to the release format (io/convert.h).
#include <iostream>
#include <string>

#include "cli/commands.h"
#include "cli/options.h"
#include "core/check.h"
#include "io/convert.h"

namespace flashmap::cli {
namespace {

struct ConvertCli {
  std::string from = "auto";
  std::string in, out, target;
  bool force = false, link = false;
};

void run_convert(const ConvertCli& c) {
  ConvertOptions o;
  o.in = c.in;
  o.out = c.out;
  o.from = parse_convert_source(c.from);
  o.target = c.target;
  o.force = c.force;
  o.link = c.link;
  const ConvertResult r = convert_checkpoint(o);
  if (r.source == "gguf") {
    std::cout << "converted GGUF " << r.kind << " target " << c.in << " -> " << c.out << ": "
              << r.tensors << " tensors ";
    if (c.link)
      std::cout << "read in place through the link model.gguf (" << r.dequantized.size()
                << " quantized: dequantized to F32 when loaded)";
    else
      std::cout << "(" << r.dequantized.size()
                << " dequantized to F32, the rest copied byte for byte)";
    std::cout << (r.tokenizer ? "; tokenizer from its metadata" : "; no tokenizer in it");
    if (r.chat_template) std::cout << ", with its chat template";
    std::cout << "\n";
    return;
  }
  std::cout << "converted " << r.source << " " << r.kind << " drafter " << c.in << " -> " << c.out
            << ": " << r.tensors << " tensors copied byte for byte";
  if (r.target.empty())
    std::cout << "; fit to a target not checked (pass --target DIR)";
  else
    std::cout << "; fits the target " << r.target;
  std::cout << "\n";
  for (const auto& d : r.dropped) std::cout << "  dropped " << d << "\n";
}

void register_convert(CLI::App& app) {
  auto opts = std::make_shared<ConvertCli>();
  CLI::App* cmd = app.add_subcommand(
      "convert",
      "Convert a drafter checkpoint to the release format (z-lab DFlash, FlashMap), or a Qwen3 "
      "GGUF target to a Hugging Face folder");
  cmd->footer(
      "speculators DFlash (full vocabulary) -> z-lab DFlash release (target_layer_ids = "
      "aux_hidden_state_layer_ids - 1); a reduced vocabulary (d2t/t2d) is refused: run such "
      "folders directly with --draft.\n"
      "specforge: SpecForge's DFlash export is the z-lab layout already: checked and copied.\n"
      "FlashMap: speculators_model_type \"flashmap\" and SpecForge FlashMap exports follow this "
      "project's own definition (docs/DFLASH.md, Conversion), not a published layout.\n"
      "auto: speculators when config.json has speculators_model_type; a folder already in a "
      "release format is an error (nothing to convert).\n"
      "GGUF: a Qwen3 GGUF target (IN a .gguf file, the first of a split one) -> a Hugging "
      "Face folder: config, generation config, tokenizer and chat template from its metadata; "
      "F32/F16/BF16 tensors copied, quantized ones dequantized to F32 as ggml does.\n"
      "Tensors are copied byte for byte; OUT is never overwritten without --force.");
  cmd->add_option("--from", opts->from, "source format: auto (default), speculators, specforge")
      ->check(CLI::IsMember({"auto", "speculators", "specforge"}));
  cmd->add_option("--target", opts->target,
                  "target folder to check the drafter against (default: a speculators "
                  "verifier that is a local folder)")
      ->check(non_empty());
  cmd->add_flag("--force", opts->force, "replace OUT if it exists");
  cmd->add_flag("--link", opts->link,
                "GGUF: OUT holds the metadata and a link to the file (model.gguf), whose tensors "
                "are read in place (what --target FILE.gguf does in a cache folder)");
  cmd->add_option("IN", opts->in, "drafter folder, or Qwen3 GGUF file, to convert")
      ->required()
      ->check(non_empty());
  cmd->add_option("OUT", opts->out, "new folder")->required()->check(non_empty());
  cmd->callback([opts] { run_convert(*opts); });
}

}  // namespace

FLASHMAP_COMMAND(register_convert);

}  // namespace flashmap::cli
