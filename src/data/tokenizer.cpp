#include "data/tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include "common/error.h"
#include "data/hf_bpe.h"

namespace keel::data {
namespace {

class ByteTokenizer : public Tokenizer {
 public:
  void encode(std::string_view text, std::vector<uint32_t>& out) const override {
    for (unsigned char c : text) out.push_back(c);
  }
  std::string decode(const int64_t* ids, size_t n) const override {
    std::string s;
    for (size_t i = 0; i < n; ++i) {
      if (ids[i] >= 0 && ids[i] < 256)
        s += static_cast<char>(ids[i]);
      else if (ids[i] == kByteBoundaryId)
        s += kBoundaryText;
      else
        s += "<?" + std::to_string(ids[i]) + ">";
    }
    return s;
  }
  int64_t vocab_size() const override { return 257; }
  uint32_t boundary_id() const override { return kByteBoundaryId; }
  nlohmann::json describe() const override {
    return {{"kind", "byte"},
            {"vocab_size", 257},
            {"boundary_id", kByteBoundaryId},
            {"note",
             "ids 0..255 are bytes, 256 is the document boundary <|endoftext|>; "
             "use model.vocab_size >= 257 (264 keeps it a multiple of 8)"}};
  }
};

class SpmTokenizer : public Tokenizer {
 public:
  explicit SpmTokenizer(const std::string& path) : path_(path) {
    auto status = sp_.Load(path);
    if (!status.ok())
      throw DataError(path + ": cannot load the SentencePiece model (" + status.ToString() +
                      "); HINT: pass a .model file written by spm_train or `spm-train:VOCAB`");
    if (sp_.eos_id() < 0)
      throw DataError(path +
                      ": the SentencePiece model has no </s> (eos) piece, which keel uses "
                      "as the document boundary; HINT: train it with eos_id >= 0");
  }
  void encode(std::string_view text, std::vector<uint32_t>& out) const override {
    std::vector<int> ids;
    sp_.Encode(text, &ids).IgnoreError();
    out.insert(out.end(), ids.begin(), ids.end());
  }
  std::string decode(const int64_t* ids, size_t n) const override {
    std::string s;
    std::vector<int> run;
    auto flush = [&] {
      std::string piece;
      sp_.Decode(run, &piece).IgnoreError();
      s += piece;
      run.clear();
    };
    for (size_t i = 0; i < n; ++i) {
      if (ids[i] == sp_.eos_id()) {
        flush();
        s += kBoundaryText;
      } else if (ids[i] >= 0 && ids[i] < sp_.GetPieceSize()) {
        run.push_back(static_cast<int>(ids[i]));
      }
    }
    flush();
    return s;
  }
  int64_t vocab_size() const override { return sp_.GetPieceSize(); }
  uint32_t boundary_id() const override { return static_cast<uint32_t>(sp_.eos_id()); }
  nlohmann::json describe() const override {
    return {{"kind", "spm"},
            {"vocab_size", vocab_size()},
            {"boundary_id", boundary_id()},
            {"model", "tokenizer.model"}};
  }

 private:
  std::string path_;
  sentencepiece::SentencePieceProcessor sp_;
};

// Pre-tokenized data: the ids are all there is; forensics still shows where the boundary falls.
class IdTokenizer : public Tokenizer {
 public:
  IdTokenizer(int64_t vocab_size, uint32_t boundary_id)
      : vocab_size_(vocab_size), boundary_id_(boundary_id) {}
  void encode(std::string_view, std::vector<uint32_t>&) const override {
    throw DataError(
        "pre-tokenized data (data.source megatron or llmc) carries no tokenizer, so text cannot "
        "become ids; HINT: prepare text with `keel prepare --tokenizer hf:tokenizer.json`");
  }
  std::string decode(const int64_t* ids, size_t n) const override {
    std::string s;
    for (size_t i = 0; i < n; ++i)
      s += ids[i] == boundary_id_ ? std::string(kBoundaryText) : "<" + std::to_string(ids[i]) + ">";
    return s;
  }
  int64_t vocab_size() const override { return vocab_size_; }
  uint32_t boundary_id() const override { return boundary_id_; }
  nlohmann::json describe() const override {
    return {{"kind", "ids"}, {"vocab_size", vocab_size_}, {"boundary_id", boundary_id_}};
  }

 private:
  int64_t vocab_size_;
  uint32_t boundary_id_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_id_tokenizer(int64_t vocab_size, uint32_t boundary_id) {
  return std::make_unique<IdTokenizer>(vocab_size, boundary_id);
}

std::unique_ptr<Tokenizer> make_byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

std::unique_ptr<Tokenizer> load_spm_tokenizer(const std::string& model_path) {
  return std::make_unique<SpmTokenizer>(model_path);
}

void train_spm(const std::string& text_file, int64_t vocab_size, const std::string& model_prefix,
               int threads, uint64_t seed) {
  std::string args = "--input=" + text_file + " --model_prefix=" + model_prefix +
                     " --vocab_size=" + std::to_string(vocab_size) +
                     " --model_type=unigram --byte_fallback=true --character_coverage=0.9995"
                     " --input_sentence_size=2000000 --shuffle_input_sentence=true"
                     " --max_sentence_length=16384 --minloglevel=2 --num_threads=" +
                     std::to_string(std::max(threads, 1));
  // Training samples sentences; seed SentencePiece's generator so prepare stays reproducible.
  sentencepiece::SetRandomGeneratorSeed(static_cast<unsigned int>(seed));
  auto status = sentencepiece::SentencePieceTrainer::Train(args);
  if (!status.ok())
    throw DataError("spm-train:" + std::to_string(vocab_size) +
                    ": SentencePiece training failed (" + status.ToString() +
                    "); HINT: with byte fallback VOCAB must exceed 259 plus the distinct "
                    "characters of the text; a small corpus needs a small VOCAB");
}

std::unique_ptr<Tokenizer> tokenizer_from_meta(const nlohmann::json& tokenizer,
                                               const std::string& dir) {
  std::string kind =
      tokenizer.is_object() && tokenizer.contains("kind") && tokenizer["kind"].is_string()
          ? tokenizer["kind"].get<std::string>()
          : "";
  if (kind == "byte") return make_byte_tokenizer();
  if (kind == "ids")
    return make_id_tokenizer(tokenizer.value("vocab_size", int64_t{0}),
                             tokenizer.value("boundary_id", uint32_t{0}));
  if (kind == "spm") {
    std::string model = tokenizer.contains("model") && tokenizer["model"].is_string()
                            ? tokenizer["model"].get<std::string>()
                            : "tokenizer.model";
    return load_spm_tokenizer(dir + "/" + model);
  }
  if (kind == "hf")
    return load_hf_tokenizer(dir + "/" + tokenizer.value("file", std::string("tokenizer.json")),
                             tokenizer.value("boundary_token", std::string()));
  throw DataError(dir + "/meta.json: unknown tokenizer kind '" + kind +
                  "'; HINT: re-run `keel prepare`");
}

}  // namespace keel::data
