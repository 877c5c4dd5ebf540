#include "io/gguf_convert.h"

#include <xxhash.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/check.h"
#include "core/dtype.h"
#include "io/convert.h"
#include "io/files.h"
#include "io/gguf.h"
#include "io/safetensors.h"

namespace flashmap {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// llama.cpp's names for a Qwen3 layer's tensors (gguf-py's tensor map, MODEL_ARCH.QWEN3) and
// transformers' Qwen3ForCausalLM names for them.
constexpr std::pair<const char*, const char*> kLayerNames[] = {
    {"attn_norm", "input_layernorm"},    {"attn_q", "self_attn.q_proj"},
    {"attn_k", "self_attn.k_proj"},      {"attn_v", "self_attn.v_proj"},
    {"attn_output", "self_attn.o_proj"}, {"attn_q_norm", "self_attn.q_norm"},
    {"attn_k_norm", "self_attn.k_norm"}, {"ffn_norm", "post_attention_layernorm"},
    {"ffn_gate", "mlp.gate_proj"},       {"ffn_up", "mlp.up_proj"},
    {"ffn_down", "mlp.down_proj"},
};

// The transformers name of a GGUF tensor of a Qwen3 with `layers` layers; empty when it has
// none (the caller refuses the tensor by name).
std::string hf_name(const std::string& name, int64_t layers) {
  if (name == "token_embd.weight") return "model.embed_tokens.weight";
  if (name == "output_norm.weight") return "model.norm.weight";
  if (name == "output.weight") return "lm_head.weight";
  if (name.rfind("blk.", 0) != 0) return {};
  const size_t dot = name.find('.', 4);
  if (dot == std::string::npos || dot == 4 || dot - 4 > 6) return {};
  int64_t layer = 0;
  for (size_t i = 4; i < dot; ++i) {
    if (name[i] < '0' || name[i] > '9') return {};
    layer = layer * 10 + (name[i] - '0');
  }
  if (layer >= layers || (name[4] == '0' && dot > 5)) return {};
  const std::string rest = name.substr(dot + 1);
  for (const auto& [gguf, hf] : kLayerNames)
    if (rest == std::string(gguf) + ".weight")
      return fmt::format("model.layers.{}.{}.weight", layer, hf);
  return {};
}

// A metadata value that must be there, as an integer in [lo, hi].
int64_t need_int(const GgufFile& f, const std::string& key, int64_t lo, int64_t hi) {
  const auto v = f.integer(key);
  FLASHMAP_CHECK(v.has_value(), "{}: no metadata '{}'", f.path(), key);
  FLASHMAP_CHECK(*v >= lo && *v <= hi, "{}: metadata '{}' = {} is outside [{}, {}]", f.path(), key,
                 *v, lo, hi);
  return *v;
}

// A string of the GGUF as JSON: it must be UTF-8 (a JSON file cannot hold other bytes).
std::string utf8_string(const GgufFile& f, const std::string& what, const std::string& s) {
  try {
    (void)json(s).dump();
  } catch (const json::exception&) {
    throw Error(fmt::format("{}: {} is not valid UTF-8", f.path(), what));
  }
  return s;
}

// A float of the metadata as JSON: a float32 by its shortest decimal form (1e-06, not the
// double nearest to the float nearest to 1e-06), which reads back as the same float.
std::optional<double> metadata_float(const GgufFile& f, const std::string& key) {
  const auto v = f.number(key);
  if (!v) return v;
  if (f.metadata().at(key).type == 6) return std::stod(fmt::format("{}", float(*v)));
  return v;
}

json qwen3_config(const GgufFile& f, int64_t vocab, bool tied) {
  const std::string a = "qwen3.";
  const int64_t hidden = need_int(f, a + "embedding_length", 1, 1 << 20);
  const int64_t heads = need_int(f, a + "attention.head_count", 1, 4096);
  const int64_t kv_heads = f.integer(a + "attention.head_count_kv").has_value()
                               ? need_int(f, a + "attention.head_count_kv", 1, heads)
                               : heads;
  FLASHMAP_CHECK(heads % kv_heads == 0,
                 "{}: metadata 'qwen3.attention.head_count' = {} is not a multiple of "
                 "'qwen3.attention.head_count_kv' = {}",
                 f.path(), heads, kv_heads);
  const int64_t head_dim = f.integer(a + "attention.key_length").has_value()
                               ? need_int(f, a + "attention.key_length", 1, 1 << 12)
                               : hidden / heads;
  if (f.integer(a + "attention.value_length").has_value())
    FLASHMAP_CHECK(need_int(f, a + "attention.value_length", 1, 1 << 12) == head_dim,
                   "{}: metadata 'qwen3.attention.value_length' differs from key_length: not a "
                   "Qwen3 this engine runs",
                   f.path());
  json c = json::object();
  c["architectures"] = {"Qwen3ForCausalLM"};
  c["model_type"] = "qwen3";
  c["hidden_size"] = hidden;
  c["intermediate_size"] = need_int(f, a + "feed_forward_length", 1, 1 << 22);
  c["num_hidden_layers"] = need_int(f, a + "block_count", 1, 4096);
  c["num_attention_heads"] = heads;
  c["num_key_value_heads"] = kv_heads;
  c["head_dim"] = head_dim;
  c["vocab_size"] = vocab;
  c["max_position_embeddings"] = need_int(f, a + "context_length", 1, int64_t(1) << 31);
  const auto eps = metadata_float(f, a + "attention.layer_norm_rms_epsilon");
  FLASHMAP_CHECK(eps.has_value(), "{}: no metadata 'qwen3.attention.layer_norm_rms_epsilon'",
                 f.path());
  c["rms_norm_eps"] = *eps;
  // llama.cpp's default when the file gives none.
  c["rope_theta"] = metadata_float(f, a + "rope.freq_base").value_or(10000.0);
  if (const auto t = f.string(a + "rope.scaling.type"); t && *t != "none")
    throw Error(
        fmt::format("{}: metadata 'qwen3.rope.scaling.type' = \"{}\": RoPE scaling is not "
                    "converted (a Qwen3 GGUF without it converts)",
                    f.path(), utf8_string(f, "metadata 'qwen3.rope.scaling.type'", *t)));
  c["hidden_act"] = "silu";
  c["attention_bias"] = false;
  c["tie_word_embeddings"] = tied;
  c["torch_dtype"] = "float32";
  if (const auto bos = f.integer("tokenizer.ggml.bos_token_id")) c["bos_token_id"] = *bos;
  if (const auto eos = f.integer("tokenizer.ggml.eos_token_id")) c["eos_token_id"] = *eos;
  return c;
}

// The token ids generation stops at: the GGUF's end of sequence and end of turn.
json generation_config(const GgufFile& f, int64_t vocab) {
  json g = json::object();
  std::vector<int64_t> eos;
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id"})
    if (const auto id = f.integer(key)) {
      FLASHMAP_CHECK(*id >= 0 && *id < vocab, "{}: metadata '{}' = {} is not a token id below {}",
                     f.path(), key, *id, vocab);
      if (std::find(eos.begin(), eos.end(), *id) == eos.end()) eos.push_back(*id);
    }
  if (const auto bos = f.integer("tokenizer.ggml.bos_token_id")) g["bos_token_id"] = *bos;
  if (eos.size() == 1) g["eos_token_id"] = eos[0];
  if (eos.size() > 1) g["eos_token_id"] = eos;
  return g;
}

// Qwen2's pre-tokenizer (llama.cpp's "qwen2"), as Qwen's tokenizer.json writes it.
json qwen2_pretokenizer() {
  const json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", false},
                           {"use_regex", false}};
  return {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"},
             {"pattern",
              {{"Regex",
                "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+"}}},
             {"behavior", "Isolated"},
             {"invert", false}},
            byte_level}}};
}

struct Tokenizer {
  json tokenizer, config;
  bool chat_template = false;
};

// tokenizer.json and tokenizer_config.json from `tokenizer.ggml.*`; nullopt when the GGUF holds
// no tokenizer. Token types as llama.cpp writes them: 1 normal, 3 control (a special added
// token), 4 user-defined (an added token that is not special), 5 unused (padding up to the
// embedding's rows), 2 unknown and 6 byte (not in a byte-level BPE).
std::optional<Tokenizer> tokenizer_files(const GgufFile& f, int64_t vocab) {
  const auto model = f.string("tokenizer.ggml.model");
  if (!model) return std::nullopt;
  FLASHMAP_CHECK(*model == "gpt2",
                 "{}: metadata 'tokenizer.ggml.model' = \"{}\": only byte-level BPE (\"gpt2\") "
                 "tokenizers convert",
                 f.path(), utf8_string(f, "metadata 'tokenizer.ggml.model'", *model));
  const std::string pre = f.string("tokenizer.ggml.pre").value_or("");
  FLASHMAP_CHECK(pre == "qwen2",
                 "{}: metadata 'tokenizer.ggml.pre' = \"{}\": only Qwen's pre-tokenizer "
                 "(\"qwen2\") converts",
                 f.path(), utf8_string(f, "metadata 'tokenizer.ggml.pre'", pre));
  const auto* tokens = f.array("tokenizer.ggml.tokens");
  const auto* types = f.array("tokenizer.ggml.token_type");
  const auto* merges = f.array("tokenizer.ggml.merges");
  FLASHMAP_CHECK(tokens && merges,
                 "{}: metadata 'tokenizer.ggml.tokens' and 'tokenizer.ggml.merges' are needed "
                 "with 'tokenizer.ggml.model'",
                 f.path());
  FLASHMAP_CHECK(int64_t(tokens->size()) <= vocab,
                 "{}: metadata 'tokenizer.ggml.tokens' has {} tokens, more than the {} rows of "
                 "token_embd.weight",
                 f.path(), tokens->size(), vocab);
  FLASHMAP_CHECK(!types || types->size() == tokens->size(),
                 "{}: metadata 'tokenizer.ggml.token_type' has {} entries for {} tokens", f.path(),
                 types ? types->size() : 0, tokens->size());
  json vocab_map = json::object(), added = json::array(), decoder = json::object();
  std::vector<std::string> specials;
  for (size_t id = 0; id < tokens->size(); ++id) {
    const auto* text = std::get_if<std::string>(&(*tokens)[id].v);
    FLASHMAP_CHECK(text, "{}: metadata 'tokenizer.ggml.tokens'[{}] is not a string", f.path(), id);
    const std::string what = fmt::format("metadata 'tokenizer.ggml.tokens'[{}]", id);
    int64_t type = 1;
    if (types) {
      const auto& t = (*types)[id].v;
      if (const auto* i = std::get_if<int64_t>(&t))
        type = *i;
      else if (const auto* u = std::get_if<uint64_t>(&t))
        type = int64_t(std::min<uint64_t>(*u, 100));
      else
        throw Error(fmt::format("{}: metadata 'tokenizer.ggml.token_type'[{}] is not an integer",
                                f.path(), id));
    }
    if (type == 5) continue;  // padding
    FLASHMAP_CHECK(type == 1 || type == 3 || type == 4,
                   "{}: metadata 'tokenizer.ggml.token_type'[{}] = {}: a byte-level BPE has only "
                   "normal (1), control (3), user-defined (4) and unused (5) tokens",
                   f.path(), id, type);
    const std::string& s = utf8_string(f, what, *text);
    if (type == 1) {
      FLASHMAP_CHECK(!vocab_map.contains(s), "{}: {} repeats token '{}'", f.path(), what, s);
      vocab_map[s] = id;
      continue;
    }
    added.push_back({{"id", id},
                     {"content", s},
                     {"single_word", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"normalized", false},
                     {"special", type == 3}});
    decoder[std::to_string(id)] = {{"content", s},         {"lstrip", false},
                                   {"normalized", false},  {"rstrip", false},
                                   {"single_word", false}, {"special", type == 3}};
    if (type == 3) specials.push_back(s);
  }
  json merge_list = json::array();
  for (size_t i = 0; i < merges->size(); ++i) {
    const auto* m = std::get_if<std::string>(&(*merges)[i].v);
    const std::string what = fmt::format("metadata 'tokenizer.ggml.merges'[{}]", i);
    FLASHMAP_CHECK(m, "{}: {} is not a string", f.path(), what);
    const size_t space = m->find(' ');
    FLASHMAP_CHECK(space != std::string::npos && space > 0 && space + 1 < m->size() &&
                       m->find(' ', space + 1) == std::string::npos,
                   "{}: {} is not two tokens separated by one space", f.path(), what);
    merge_list.push_back(
        {utf8_string(f, what, m->substr(0, space)), utf8_string(f, what, m->substr(space + 1))});
  }
  const json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", false},
                           {"use_regex", false}};
  Tokenizer t;
  t.tokenizer = {{"version", "1.0"},
                 {"truncation", nullptr},
                 {"padding", nullptr},
                 {"added_tokens", added},
                 {"normalizer", {{"type", "NFC"}}},
                 {"pre_tokenizer", qwen2_pretokenizer()},
                 {"post_processor", byte_level},
                 {"decoder", byte_level},
                 {"model",
                  {{"type", "BPE"},
                   {"dropout", nullptr},
                   {"unk_token", nullptr},
                   {"continuing_subword_prefix", ""},
                   {"end_of_word_suffix", ""},
                   {"fuse_unk", false},
                   {"byte_fallback", false},
                   {"ignore_merges", false},
                   {"vocab", vocab_map},
                   {"merges", merge_list}}}};
  auto token_text = [&](const char* key) -> json {
    const auto id = f.integer(key);
    if (!id) return nullptr;
    FLASHMAP_CHECK(*id >= 0 && size_t(*id) < tokens->size(),
                   "{}: metadata '{}' = {} is not one of the {} tokens", f.path(), key, *id,
                   tokens->size());
    return utf8_string(f, fmt::format("metadata 'tokenizer.ggml.tokens'[{}]", *id),
                       std::get<std::string>((*tokens)[size_t(*id)].v));
  };
  const bool add_bos = [&] {
    auto it = f.metadata().find("tokenizer.ggml.add_bos_token");
    if (it == f.metadata().end()) return false;
    const auto* b = std::get_if<bool>(&it->second.v);
    FLASHMAP_CHECK(b, "{}: metadata 'tokenizer.ggml.add_bos_token' is not a bool", f.path());
    return *b;
  }();
  t.config = {{"tokenizer_class", "Qwen2Tokenizer"},
              {"add_bos_token", add_bos},
              {"add_prefix_space", false},
              {"bos_token", token_text("tokenizer.ggml.bos_token_id")},
              {"eos_token", token_text("tokenizer.ggml.eos_token_id")},
              {"pad_token", token_text("tokenizer.ggml.padding_token_id")},
              {"unk_token", nullptr},
              {"clean_up_tokenization_spaces", false},
              {"errors", "replace"},
              {"split_special_tokens", false},
              {"added_tokens_decoder", decoder}};
  if (const auto tmpl = f.string("tokenizer.chat_template")) {
    t.config["chat_template"] = utf8_string(f, "metadata 'tokenizer.chat_template'", *tmpl);
    t.chat_template = true;
  }
  return t;
}

void write_json(const fs::path& path, const json& j) {
  AtomicFile out(path.string());
  out.write(j.dump(2) + "\n");
  out.commit();
}

// model.safetensors from the GGUF's tensors, one row block in memory at a time.
void write_tensors(const fs::path& path, const GgufFile& f,
                   const std::vector<std::pair<std::string, const GgufTensor*>>& tensors) {
  json header = json::object();
  header["__metadata__"] = {{"format", "pt"}};
  uint64_t offset = 0;
  auto out_dtype = [](GgmlType t) { return ggml_float_dtype(t).value_or(DType::F32); };
  for (const auto& [name, t] : tensors) {
    std::vector<int64_t> shape(t->dims.rbegin(), t->dims.rend());
    const DType d = out_dtype(t->type);
    const uint64_t bytes = uint64_t(t->numel()) * dtype_size(d);
    header[name] = {{"dtype", std::string(dtype_name(d))},
                    {"shape", shape},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string h = header.dump();
  while (h.size() % 8) h.push_back(' ');
  AtomicFile out(path.string());
  char len[8];
  for (int i = 0; i < 8; ++i) len[i] = char((uint64_t(h.size()) >> (8 * i)) & 0xff);
  out.write(len, 8);
  out.write(h);
  std::vector<float> rows;
  for (const auto& [name, t] : tensors) {
    const int64_t n = t->dims.empty() ? 1 : t->dims[0], nrows = t->rows();
    const DType d = out_dtype(t->type);
    if (d != DType::F32 || t->type == GgmlType::F32) {
      out.write(t->data, t->bytes);  // byte for byte
    } else {
      const uint64_t row_bytes = t->bytes / uint64_t(std::max<int64_t>(nrows, 1));
      const int64_t block = std::max<int64_t>(1, (1 << 20) / std::max<int64_t>(n, 1));
      for (int64_t r0 = 0; r0 < nrows; r0 += block) {
        const int64_t m = std::min(block, nrows - r0);
        rows.resize(size_t(m * n));
        for (int64_t r = 0; r < m; ++r)
          dequantize_row(t->type, t->data + uint64_t(r0 + r) * row_bytes, rows.data() + r * n, n);
        out.write(rows.data(), rows.size() * sizeof(float));
      }
    }
    f.check_unchanged();  // what was read came from the file as it was mapped
  }
  out.commit();
}

}  // namespace

bool is_gguf_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[4] = {};
  return in.read(magic, 4) && std::memcmp(magic, "GGUF", 4) == 0;
}

std::vector<std::pair<std::string, const GgufTensor*>> qwen3_gguf_tensors(const GgufFile& f) {
  const std::string& in = f.path();
  const auto arch = f.string("general.architecture");
  FLASHMAP_CHECK(arch.has_value(), "{}: no metadata 'general.architecture'", in);
  FLASHMAP_CHECK(*arch == "qwen3",
                 "{}: metadata 'general.architecture' = \"{}\": only Qwen3 (\"qwen3\") targets "
                 "are read",
                 in, utf8_string(f, "metadata 'general.architecture'", *arch));
  const int64_t layers = need_int(f, "qwen3.block_count", 1, 4096);
  FLASHMAP_CHECK(f.contains("token_embd.weight"), "{}: no tensor 'token_embd.weight'", in);
  const GgufTensor& embd = f.tensor("token_embd.weight");
  FLASHMAP_CHECK(embd.dims.size() == 2, "{}: tensor 'token_embd.weight' has {} dimensions, not 2",
                 in, embd.dims.size());
  std::vector<std::pair<std::string, const GgufTensor*>> tensors;
  for (const auto& [name, t] : f.tensors()) {
    const std::string hf = hf_name(name, layers);
    FLASHMAP_CHECK(!hf.empty(), "{}: tensor '{}' is not one of a {}-layer Qwen3's", in, name,
                   layers);
    tensors.emplace_back(hf, &t);
  }
  return tensors;
}

GgufConvertResult convert_gguf(const std::string& in, const std::string& out, bool force,
                               GgufTensors mode) {
  const GgufFile f(in);
  const auto tensors = qwen3_gguf_tensors(f);
  const int64_t vocab = f.tensor("token_embd.weight").dims[1];
  const bool tied = !f.contains("output.weight");

  GgufConvertResult r;
  r.tensors = tensors.size();
  for (const auto& [name, t] : tensors)
    if (!ggml_float_dtype(t->type))
      r.dequantized.push_back(fmt::format("{} ({})", t->name, ggml_type_name(uint32_t(t->type))));
  const json config = qwen3_config(f, vocab, tied);
  const json generation = generation_config(f, vocab);
  const auto tok = tokenizer_files(f, vocab);
  r.tokenizer = tok.has_value();
  r.chat_template = tok && tok->chat_template;
  // The file the link names: absolute, so that the folder can move, and through any links, so
  // that the other files of a split model are found beside it.
  std::error_code ec;
  const fs::path linked = fs::canonical(in, ec);
  FLASHMAP_CHECK(!ec, "{}: cannot resolve its path ({})", in, ec.message());
  write_output_folder(in, out, force, [&](const std::string& dir) {
    write_json(fs::path(dir) / "config.json", config);
    write_json(fs::path(dir) / "generation_config.json", generation);
    if (tok) {
      write_json(fs::path(dir) / "tokenizer.json", tok->tokenizer);
      write_json(fs::path(dir) / "tokenizer_config.json", tok->config);
    }
    if (mode == GgufTensors::Link) {
      std::error_code e;
      fs::create_symlink(linked, fs::path(dir) / "model.gguf", e);
      FLASHMAP_CHECK(!e, "{}: cannot link model.gguf to {} ({})", dir, linked.string(),
                     e.message());
    } else {
      write_tensors(fs::path(dir) / "model.safetensors", f, tensors);
    }
  });
  return r;
}

std::string gguf_model_folder(const std::string& path) {
  std::error_code ec;
  const fs::path file = fs::canonical(path, ec);
  FLASHMAP_CHECK(!ec, "{}: cannot open ({})", path, ec.message());
  const auto size = fs::file_size(file, ec);
  FLASHMAP_CHECK(!ec, "{}: cannot stat ({})", path, ec.message());
  const auto mtime = fs::last_write_time(file, ec).time_since_epoch().count();
  FLASHMAP_CHECK(!ec, "{}: cannot stat ({})", path, ec.message());
  const std::string cache = cache_dir();
  FLASHMAP_CHECK(!cache.empty(),
                 "{}: no cache folder to make its model folder in (FLASHMAP_CACHE_DIR is off, or "
                 "there is no HOME): make one with flashmap convert --link and pass that",
                 path);
  // One folder per file as it is now (path, size, modification time) and per layout of the
  // folder (the number after "gguf").
  const std::string id = fmt::format("{}\n{}\n{}", file.string(), size, mtime);
  const fs::path dir =
      fs::path(cache) / "gguf1" /
      fmt::format("{}-{:016x}", file.stem().string(), XXH3_64bits(id.data(), id.size()));
  if (fs::is_regular_file(dir / "config.json", ec) && fs::is_symlink(dir / "model.gguf", ec) &&
      fs::read_symlink(dir / "model.gguf", ec) == file)
    return dir.string();
  fs::create_directories(dir.parent_path(), ec);
  FLASHMAP_CHECK(!ec, "{}: cannot create the folder for {}'s model folder ({})",
                 dir.parent_path().string(), path, ec.message());
  convert_gguf(file.string(), dir.string(), /*force=*/true, GgufTensors::Link);
  return dir.string();
}

}  // namespace flashmap
