#include "data/hf_tokenizer.h"

#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string_view>

#include "common/error.h"
#include "data/tokenizer.h"

namespace keel::data {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string read_bytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(path.string() + ": cannot be read");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

void write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  out.close();
  if (!out) throw UserError(path.string() + ": cannot be written");
}

std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

std::string base64(std::string_view bytes) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  out.reserve((bytes.size() + 2) / 3 * 4);
  size_t i = 0;
  for (; i + 2 < bytes.size(); i += 3) {
    const uint32_t v =
        (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8) | uint8_t(bytes[i + 2]);
    for (int k = 18; k >= 0; k -= 6) out += kAlphabet[(v >> k) & 0x3F];
  }
  if (i + 1 == bytes.size()) {
    const uint32_t v = uint8_t(bytes[i]) << 16;
    out += kAlphabet[(v >> 18) & 0x3F];
    out += kAlphabet[(v >> 12) & 0x3F];
    out += "==";
  } else if (i + 2 == bytes.size()) {
    const uint32_t v = (uint8_t(bytes[i]) << 16) | (uint8_t(bytes[i + 1]) << 8);
    out += kAlphabet[(v >> 18) & 0x3F];
    out += kAlphabet[(v >> 12) & 0x3F];
    out += kAlphabet[(v >> 6) & 0x3F];
    out += '=';
  }
  return out;
}

json added_token(int64_t id, const std::string& content, bool special) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", special}};
}

// ---- byte-level ---------------------------------------------------------------------------------

HfTokenizerFiles write_byte(const fs::path& out_dir, int64_t model_max_length) {
  json vocab = json::object();
  const auto& chars = gpt2_byte_chars();
  for (int b = 0; b < 256; ++b) vocab[chars[b]] = b;
  vocab[kBoundaryText] = kByteBoundaryId;
  const json byte_level = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", true},
                           {"use_regex", false}};
  const json tokenizer = {{"version", "1.0"},
                          {"truncation", nullptr},
                          {"padding", nullptr},
                          {"added_tokens", {added_token(kByteBoundaryId, kBoundaryText, true)}},
                          {"normalizer", nullptr},
                          {"pre_tokenizer", byte_level},
                          {"post_processor", nullptr},
                          {"decoder", byte_level},
                          {"model",
                           {{"type", "BPE"},
                            {"dropout", nullptr},
                            {"unk_token", nullptr},
                            {"continuing_subword_prefix", nullptr},
                            {"end_of_word_suffix", nullptr},
                            {"fuse_unk", false},
                            {"byte_fallback", false},
                            {"ignore_merges", false},
                            {"vocab", vocab},
                            {"merges", json::array()}}}};
  const json config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                       {"bos_token", kBoundaryText},
                       {"eos_token", kBoundaryText},
                       {"add_bos_token", false},
                       {"add_eos_token", false},
                       {"clean_up_tokenization_spaces", false},
                       {"model_max_length", model_max_length}};
  write_text(out_dir / "tokenizer.json", tokenizer.dump(2));
  write_text(out_dir / "tokenizer_config.json", config.dump(2));
  return {"byte",
          kByteBoundaryId,
          kByteBoundaryId,
          {"tokenizer.json", "tokenizer_config.json"},
          "decoding bytes that are not valid UTF-8 gives U+FFFD where keel writes the raw bytes"};
}

// ---- SentencePiece ------------------------------------------------------------------------------

// What keel needs of a SentencePiece ModelProto (sentencepiece_model.proto; proto2 defaults).
struct SpmModel {
  struct Piece {
    std::string piece;
    double score = 0.0;
    int type = 1;  // NORMAL 1, UNKNOWN 2, CONTROL 3, USER_DEFINED 4, UNUSED 5, BYTE 6
  };
  std::vector<Piece> pieces;
  int model_type = 1;  // UNIGRAM 1, BPE 2, WORD 3, CHAR 4
  bool byte_fallback = false, split_by_whitespace = true, treat_whitespace_as_suffix = false;
  int64_t unk_id = 0, bos_id = 1, eos_id = 2;
  std::string precompiled_charsmap;
  bool add_dummy_prefix = true, remove_extra_whitespaces = true, escape_whitespaces = true;
};

// The protobuf wire format, just enough to walk ModelProto's fields.
class WireReader {
 public:
  WireReader(std::string_view bytes, const std::string& file) : s_(bytes), file_(file) {}
  bool done() const { return pos_ >= s_.size(); }
  // The next field's number and wire type.
  std::pair<uint32_t, uint32_t> tag() {
    const uint64_t t = varint();
    return {static_cast<uint32_t>(t >> 3), static_cast<uint32_t>(t & 7)};
  }
  uint64_t varint() {
    uint64_t v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      need(1);
      const uint8_t b = static_cast<uint8_t>(s_[pos_++]);
      v |= uint64_t(b & 0x7F) << shift;
      if (!(b & 0x80)) return v;
    }
    fail();
  }
  std::string_view bytes() {
    const uint64_t n = varint();
    need(n);
    auto out = s_.substr(pos_, n);
    pos_ += n;
    return out;
  }
  float fixed32() {
    need(4);
    float f;
    std::memcpy(&f, s_.data() + pos_, 4);
    pos_ += 4;
    return f;
  }
  void skip(uint32_t wire) {
    switch (wire) {
      case 0:
        varint();
        break;
      case 1:
        need(8);
        pos_ += 8;
        break;
      case 2:
        bytes();
        break;
      case 5:
        need(4);
        pos_ += 4;
        break;
      default:
        fail();
    }
  }

 private:
  void need(uint64_t n) const {
    if (n > s_.size() - pos_) fail();
  }
  [[noreturn]] void fail() const {
    throw DataError(file_ + ": not a SentencePiece model (malformed protobuf)");
  }
  std::string_view s_;
  size_t pos_ = 0;
  const std::string& file_;
};

SpmModel parse_spm(const std::string& bytes, const std::string& file) {
  SpmModel m;
  WireReader r(bytes, file);
  while (!r.done()) {
    auto [field, wire] = r.tag();
    if (field == 1 && wire == 2) {  // pieces
      WireReader p(r.bytes(), file);
      SpmModel::Piece piece;
      while (!p.done()) {
        auto [f, w] = p.tag();
        if (f == 1 && w == 2)
          piece.piece = std::string(p.bytes());
        else if (f == 2 && w == 5)
          piece.score = p.fixed32();
        else if (f == 3 && w == 0)
          piece.type = static_cast<int>(p.varint());
        else
          p.skip(w);
      }
      m.pieces.push_back(std::move(piece));
    } else if (field == 2 && wire == 2) {  // trainer_spec
      WireReader t(r.bytes(), file);
      while (!t.done()) {
        auto [f, w] = t.tag();
        if (w != 0) {
          t.skip(w);
          continue;
        }
        const auto v = static_cast<int64_t>(t.varint());
        switch (f) {
          case 3:
            m.model_type = static_cast<int>(v);
            break;
          case 22:
            m.split_by_whitespace = v != 0;
            break;
          case 24:
            m.treat_whitespace_as_suffix = v != 0;
            break;
          case 35:
            m.byte_fallback = v != 0;
            break;
          case 40:
            m.unk_id = static_cast<int32_t>(v);
            break;
          case 41:
            m.bos_id = static_cast<int32_t>(v);
            break;
          case 42:
            m.eos_id = static_cast<int32_t>(v);
            break;
          default:
            break;
        }
      }
    } else if (field == 3 && wire == 2) {  // normalizer_spec
      WireReader n(r.bytes(), file);
      while (!n.done()) {
        auto [f, w] = n.tag();
        if (f == 2 && w == 2)
          m.precompiled_charsmap = std::string(n.bytes());
        else if (f == 3 && w == 0)
          m.add_dummy_prefix = n.varint() != 0;
        else if (f == 4 && w == 0)
          m.remove_extra_whitespaces = n.varint() != 0;
        else if (f == 5 && w == 0)
          m.escape_whitespaces = n.varint() != 0;
        else
          n.skip(w);
      }
    } else {
      r.skip(wire);
    }
  }
  if (m.pieces.empty()) throw DataError(file + ": a SentencePiece model without pieces");
  return m;
}

std::string piece_or_null(const SpmModel& m, int64_t id) {
  return id >= 0 && id < static_cast<int64_t>(m.pieces.size()) ? m.pieces[id].piece : "";
}

// tokenizer.json for a unigram model, as transformers' SpmConverter builds it.
json unigram_tokenizer_json(const SpmModel& m) {
  json vocab = json::array();
  json added = json::array();
  for (size_t i = 0; i < m.pieces.size(); ++i) {
    vocab.push_back({m.pieces[i].piece, m.pieces[i].score});
    // control pieces are special; user-defined ones are matched in text but not special
    if (m.pieces[i].type == 3 || m.pieces[i].type == 4)
      added.push_back(
          added_token(static_cast<int64_t>(i), m.pieces[i].piece, m.pieces[i].type == 3));
  }
  json normalizers = json::array();
  if (!m.precompiled_charsmap.empty())
    normalizers.push_back(
        {{"type", "Precompiled"}, {"precompiled_charsmap", base64(m.precompiled_charsmap)}});
  if (m.remove_extra_whitespaces) {
    normalizers.push_back({{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}});
    normalizers.push_back(
        {{"type", "Replace"}, {"pattern", {{"Regex", " {2,}"}}}, {"content", " "}});
  }
  const std::string meta = "\u2581";  // SentencePiece's visible space
  json decoders =
      json::array({{{"type", "Replace"}, {"pattern", {{"String", meta}}}, {"content", " "}}});
  if (m.byte_fallback) decoders.push_back({{"type", "ByteFallback"}});
  decoders.push_back({{"type", "Fuse"}});
  if (m.add_dummy_prefix)
    decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
  return {{"version", "1.0"},
          {"truncation", nullptr},
          {"padding", nullptr},
          {"added_tokens", added},
          {"normalizer", {{"type", "Sequence"}, {"normalizers", normalizers}}},
          {"pre_tokenizer",
           {{"type", "Metaspace"},
            {"replacement", meta},
            {"prepend_scheme", m.add_dummy_prefix ? "always" : "never"},
            {"split", m.split_by_whitespace}}},
          {"post_processor", nullptr},
          {"decoder", {{"type", "Sequence"}, {"decoders", decoders}}},
          {"model",
           {{"type", "Unigram"},
            {"unk_id", m.unk_id},
            {"vocab", vocab},
            {"byte_fallback", m.byte_fallback}}}};
}

HfTokenizerFiles write_spm(const fs::path& model_file, int64_t boundary_id, const fs::path& out_dir,
                           int64_t model_max_length) {
  const std::string bytes = read_bytes(model_file);
  const SpmModel m = parse_spm(bytes, model_file.string());
  HfTokenizerFiles files;
  files.kind = "spm";
  files.eos_id = boundary_id;
  files.bos_id = m.bos_id >= 0 ? m.bos_id : boundary_id;
  write_text(out_dir / "tokenizer.model", bytes);
  files.files.push_back("tokenizer.model");
  json config = {{"add_bos_token", false},
                 {"add_eos_token", false},
                 {"clean_up_tokenization_spaces", false},
                 {"model_max_length", model_max_length}};
  for (auto [key, id] : {std::pair{"bos_token", files.bos_id}, std::pair{"eos_token", files.eos_id},
                         std::pair{"unk_token", m.unk_id}}) {
    const std::string piece = piece_or_null(m, id);
    config[key] = piece.empty() ? json(nullptr) : json(piece);
  }
  if (m.model_type == 1 && m.escape_whitespaces && !m.treat_whitespace_as_suffix) {
    config["tokenizer_class"] = "PreTrainedTokenizerFast";
    write_text(out_dir / "tokenizer.json", unigram_tokenizer_json(m).dump(2));
    files.files.push_back("tokenizer.json");
    files.note =
        "SentencePiece and tokenizers break ties between equal-score segmentations differently; "
        "rare texts encode to another, equally scored, sequence";
  } else {
    // BPE: transformers' LlamaTokenizer reads the .model (Llama's own tokenizers are such models).
    config["tokenizer_class"] = "LlamaTokenizer";
    config["legacy"] = false;
    config["add_prefix_space"] = m.add_dummy_prefix;
    files.note = m.model_type == 2 ? ""
                                   : "a SentencePiece model that is neither unigram nor BPE: "
                                     "LlamaTokenizer may split text otherwise than keel";
  }
  write_text(out_dir / "tokenizer_config.json", config.dump(2));
  files.files.push_back("tokenizer_config.json");
  return files;
}

// ---- a Hugging Face tokenizer.json given to prepare
// ----------------------------------------------

// The very file prepare tokenized with, and a config naming its boundary as eos (and bos: keel's
// documents start after a boundary).
HfTokenizerFiles write_hf(const fs::path& data_dir, const json& tok, const fs::path& out_dir,
                          int64_t model_max_length) {
  const std::string file = tok.value("file", std::string("tokenizer.json"));
  const std::string boundary = tok.value("boundary_token", std::string());
  write_text(out_dir / "tokenizer.json", read_bytes(data_dir / file));
  const json config = {{"tokenizer_class", "PreTrainedTokenizerFast"},
                       {"bos_token", boundary},
                       {"eos_token", boundary},
                       {"add_bos_token", false},
                       {"add_eos_token", false},
                       {"clean_up_tokenization_spaces", false},
                       {"model_max_length", model_max_length}};
  write_text(out_dir / "tokenizer_config.json", config.dump(2));
  const auto id = tok.value("boundary_id", int64_t{0});
  return {"hf", id, id, {"tokenizer.json", "tokenizer_config.json"}, ""};
}

}  // namespace

const std::vector<std::string>& gpt2_byte_chars() {
  // Printable Latin-1 bytes map to themselves; the other 68 to 256, 257, ... in byte order.
  static const std::vector<std::string> chars = [] {
    std::vector<std::string> out(256);
    uint32_t next = 256;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      out[b] = utf8(printable ? b : next++);
    }
    return out;
  }();
  return chars;
}

HfTokenizerFiles write_hf_tokenizer(const fs::path& data_dir, const fs::path& out_dir,
                                    int64_t model_max_length) {
  const fs::path meta_file = data_dir / "meta.json";
  json meta;
  try {
    meta = json::parse(read_bytes(meta_file));
  } catch (const json::exception& e) {
    throw DataError(meta_file.string() + ": not valid JSON (" + e.what() + ")");
  }
  const json tok = meta.value("tokenizer", json::object());
  const std::string kind = tok.is_object() ? tok.value("kind", "") : "";
  if (kind == "byte") return write_byte(out_dir, model_max_length);
  if (kind == "spm") {
    const int64_t boundary = tok.value("boundary_id", meta.value("boundary_id", int64_t{-1}));
    if (boundary < 0) throw DataError(meta_file.string() + ": the tokenizer has no boundary_id");
    return write_spm(data_dir / tok.value("model", "tokenizer.model"), boundary, out_dir,
                     model_max_length);
  }
  if (kind == "hf") return write_hf(data_dir, tok, out_dir, model_max_length);
  throw DataError(meta_file.string() + ": unknown tokenizer kind '" + kind +
                  "'; HINT: re-run `keel prepare`");
}

}  // namespace keel::data
