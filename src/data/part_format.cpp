#include "data/part_format.h"

namespace keel::data {
namespace fs = std::filesystem;

nlohmann::json options_json(const PrepareOptions& o) {
  const char* cluster = o.cluster == ClusterBy::kMinHash ? "minhash"
                        : o.cluster == ClusterBy::kHash  ? "hash"
                                                         : "source";
  return {{"inputs", o.inputs},
          {"format", o.input.format},
          {"text_field", o.input.text_field},
          {"id_field", o.input.id_field},
          {"separator", o.input.separator},
          {"tokenizer", o.tokenizer.kind == TokenizerSpec::Kind::kByte ? "byte"
                        : o.tokenizer.kind == TokenizerSpec::Kind::kHf ? "hf"
                                                                       : "spm"},
          {"exact_dedup", o.exact_dedup},
          {"near_dedup", o.near_dedup},
          {"minhash_scheme", minhash_scheme_name(o.minhash.scheme)},
          {"num_perm", o.minhash.num_perm},
          {"bands", o.minhash.bands},
          {"threshold", o.minhash.threshold},
          {"char_shingles", o.minhash.char_shingles},
          {"shingle_size", o.minhash.shingle_size},
          {"min_length", o.length.min_length},
          {"max_length", o.length.max_length},
          {"drop_percentile_tails", o.length.drop_percentile_tails},
          {"max_repeated_share", o.repetition.max_repeated_share},
          {"max_top_char_share", o.repetition.max_top_char_share},
          {"val_fraction", o.val_fraction},
          {"seq_len", o.seq_len},
          {"keep_whole", o.keep_whole},
          {"cluster", cluster},
          {"shard_tokens", o.shard_tokens},
          {"seed", o.seed}};
}

PrepareOptions options_from(const nlohmann::json& j, const fs::path& part_dir) {
  PrepareOptions o;
  o.inputs = j.at("inputs").get<std::vector<std::string>>();
  o.input.format = j.at("format").get<std::string>();
  o.input.text_field = j.at("text_field").get<std::string>();
  o.input.id_field = j.at("id_field").get<std::string>();
  o.input.separator = j.at("separator").get<std::string>();
  const std::string tokenizer = j.at("tokenizer").get<std::string>();
  if (tokenizer == "hf") {
    o.tokenizer.kind = TokenizerSpec::Kind::kHf;
    o.tokenizer.model = (part_dir / "tokenizer.json").string();
  } else if (tokenizer == "spm") {
    o.tokenizer.kind = TokenizerSpec::Kind::kSpm;
    o.tokenizer.model = (part_dir / "tokenizer.model").string();
  }
  o.exact_dedup = j.at("exact_dedup").get<bool>();
  o.near_dedup = j.at("near_dedup").get<bool>();
  // Parts written before the scheme was recorded used keel's.
  o.minhash.scheme = j.value("minhash_scheme", "keel") == "datatrove" ? MinHashScheme::kDatatrove
                                                                      : MinHashScheme::kKeel;
  o.minhash.num_perm = j.at("num_perm").get<int>();
  o.minhash.bands = j.at("bands").get<int>();
  o.minhash.threshold = j.at("threshold").get<double>();
  o.minhash.char_shingles = j.at("char_shingles").get<bool>();
  o.minhash.shingle_size = j.at("shingle_size").get<int>();
  o.length.min_length = j.at("min_length").get<int64_t>();
  o.length.max_length = j.at("max_length").get<int64_t>();
  o.length.drop_percentile_tails = j.at("drop_percentile_tails").get<double>();
  o.repetition.max_repeated_share = j.at("max_repeated_share").get<double>();
  o.repetition.max_top_char_share = j.at("max_top_char_share").get<double>();
  o.val_fraction = j.at("val_fraction").get<double>();
  o.seq_len = j.at("seq_len").get<int64_t>();
  o.keep_whole = j.at("keep_whole").get<double>();
  const std::string cluster = j.at("cluster").get<std::string>();
  o.cluster = cluster == "hash"     ? ClusterBy::kHash
              : cluster == "source" ? ClusterBy::kSource
                                    : ClusterBy::kMinHash;
  o.shard_tokens = j.at("shard_tokens").get<int64_t>();
  o.seed = j.at("seed").get<uint64_t>();
  return o;
}

}  // namespace keel::data
