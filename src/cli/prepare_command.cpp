// `keel prepare`: raw text -> training shards (src/data/prepare.h does the work).
#include <fmt/format.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <functional>
#include <iostream>
#include <map>
#include <memory>

#include "cli/commands.h"
#include "cli/number_options.h"
#include "common/error.h"
#include "common/log.h"
#include "data/prepare.h"
#include "data/prepare_parts.h"
#include "monitor/progress.h"

namespace keel::cli {

namespace {

// The progress line of a prepare: rewritten at most 5 times a second on a terminal, a log line
// every 10 s otherwise (and at each pass's start).
std::function<void(const data::PrepareProgress&)> prepare_progress_printer(
    monitor::Progress& progress) {
  struct Pace {
    int pass = 0;
    std::chrono::steady_clock::time_point shown, logged;
  };
  auto pace = std::make_shared<Pace>();
  return [&progress, pace](const data::PrepareProgress& p) {
    const auto now = std::chrono::steady_clock::now();
    const bool new_pass = p.pass != pace->pass;
    if (!new_pass && now - pace->shown < std::chrono::milliseconds(200)) return;
    const bool log = new_pass || now - pace->logged >= std::chrono::seconds(10);
    pace->pass = p.pass;
    pace->shown = now;
    if (log) pace->logged = now;
    const double mb = static_cast<double>(p.bytes_read) / 1e6;
    std::string line = fmt::format("pass {}/2 ({}) | {} documents | {:.1f} MB", p.pass,
                                   p.pass == 1 ? "dedup, filters" : "tokenize, write",
                                   monitor::format_count(static_cast<double>(p.documents)), mb);
    if (p.bytes_total > 0) line += fmt::format(" of {:.1f} MB", p.bytes_total / 1e6);
    if (p.seconds > 0) line += fmt::format(" | {:.1f} MB/s", mb / p.seconds);
    if (p.pass == 2)
      line += fmt::format(" | {} tokens | {} tok/s",
                          monitor::format_count(static_cast<double>(p.tokens_out)),
                          monitor::format_count(p.tokens_out / std::max(p.seconds, 1e-9)));
    if (p.bytes_total > 0 && p.bytes_read > 0) {
      const double left = std::max<double>(p.bytes_total - p.bytes_read, 0);
      line += " | ETA " + monitor::format_duration(p.seconds / p.bytes_read * left) +
              (p.pass == 1 ? " (pass 1)" : "");
    }
    progress.show("data", line, log);
  };
}

}  // namespace

namespace {

// Inputs, output and tokenizer.
void add_io_options(CLI::App& sub, data::PrepareOptions& o, std::string& tokenizer) {
  sub.add_option("--input", o.inputs, "input files, directories or globs");
  sub.add_option("--output", o.output,
                 "dataset directory to write (new or empty); with --task, the directory of parts")
      ->required();
  sub.add_flag("--overwrite", o.overwrite,
               "replace what --output holds: the new dataset is written beside it and swapped in "
               "whole at the end");
  sub.add_option("--tokenizer", tokenizer,
                 "byte | spm:MODEL | spm-train:VOCAB | hf:PATH/tokenizer.json")
      ->capture_default_str();
  sub.add_option("--format", o.input.format, "auto | text | jsonl | parquet")
      ->capture_default_str();
  sub.add_option("--text-field", o.input.text_field, "JSONL key or parquet column holding the text")
      ->capture_default_str();
  sub.add_option(
         "--id-field", o.input.id_field,
         "JSONL key or parquet column of a record's own id, kept with its file and line (or "
         "row) as provenance")
      ->capture_default_str();
  sub.add_option("--separator", o.input.separator,
                 "text: a line equal to this separates documents (default: one document per file)");
}

// Exact and near-duplicate removal.
void add_dedup_options(CLI::App& sub, data::PrepareOptions& o, std::string& shingle,
                       std::string& scheme, bool& no_exact, bool& no_near) {
  sub.add_option("--minhash-scheme", scheme,
                 "keel: a candidate is a duplicate when its estimated Jaccard similarity with a "
                 "kept document reaches --dedup-threshold; datatrove: FineWeb's dedup, decision "
                 "for decision (every candidate, and chains of them; word 5-grams, 14 bands of 8 "
                 "unless --shingle-size, --num-perm, --bands say otherwise; with "
                 "--no-exact-dedup, exactly the documents datatrove removes)")
      ->check(CLI::IsMember({"keel", "datatrove"}))
      ->capture_default_str();
  sub.add_option("--dedup-threshold", o.minhash.threshold,
                 "Jaccard similarity at which documents are near duplicates")
      ->capture_default_str();
  sub.add_option("--num-perm", o.minhash.num_perm, "MinHash permutations")->capture_default_str();
  sub.add_option("--bands", o.minhash.bands, "LSH bands (num_perm / bands rows each)")
      ->capture_default_str();
  sub.add_option("--shingle", shingle, "word | char")
      ->check(CLI::IsMember({"word", "char"}))
      ->capture_default_str();
  sub.add_option("--shingle-size", o.minhash.shingle_size, "words or characters per shingle")
      ->capture_default_str();
  sub.add_flag("--no-exact-dedup", no_exact, "keep exact duplicates");
  sub.add_flag("--no-near-dedup", no_near, "skip MinHash near-duplicate removal");
}

// --minhash-scheme datatrove: datatrove's MinhashConfig defaults where the flags are not given.
void apply_datatrove_scheme(const CLI::App& sub, data::MinHashConfig& m) {
  if (sub.get_option("--dedup-threshold")->count() > 0)
    throw DataError(
        "--dedup-threshold with --minhash-scheme datatrove: datatrove's scheme has no "
        "similarity check (every LSH candidate is a duplicate); leave the threshold "
        "out, or use --minhash-scheme keel");
  m.scheme = data::MinHashScheme::kDatatrove;
  if (sub.get_option("--shingle-size")->count() == 0) m.shingle_size = 5;
  if (sub.get_option("--bands")->count() == 0) m.bands = 14;
  if (sub.get_option("--num-perm")->count() == 0) m.num_perm = m.bands * 8;
}

// Length and repetition filters; the split, packing, clusters, shards and threads.
void add_filter_and_packing_options(CLI::App& sub, data::PrepareOptions& o) {
  sub.add_option("--min-length", o.length.min_length, "remove documents shorter (bytes)")
      ->capture_default_str();
  sub.add_option("--max-length", o.length.max_length, "remove documents longer (bytes; 0 = none)")
      ->capture_default_str();
  sub.add_option("--drop-percentile-tails", o.length.drop_percentile_tails,
                 "P: also remove the shortest and longest P percent (0 = off)")
      ->capture_default_str();
  sub.add_option("--max-repeated-share", o.repetition.max_repeated_share,
                 "remove documents whose bytes are more than this share repeats of their own "
                 "earlier 32-byte spans (0 = off)")
      ->capture_default_str();
  sub.add_option("--max-top-char-share", o.repetition.max_top_char_share,
                 "remove documents where one character is more than this share of the "
                 "non-whitespace text (0 = off)")
      ->capture_default_str();
  sub.add_option("--val-fraction", o.val_fraction,
                 "share of documents for the val split (0 = no val split)")
      ->capture_default_str();
  sub.add_option("--seq-len", o.seq_len, "training window length the data is packed for")
      ->capture_default_str();
  sub.add_option("--keep-whole", o.keep_whole,
                 "share of window-sized documents started on a window boundary instead of split "
                 "(0 = off)")
      ->capture_default_str();
  sub.add_option("--cluster", o.cluster,
                 "the stratified sampler's cluster of a document: minhash (the first value of its "
                 "MinHash signature, so similar documents share one; the default) | hash (of the "
                 "text: at random) | source (its input file)")
      ->option_text("minhash|hash|source")
      ->transform(CLI::CheckedTransformer(
          std::map<std::string, data::ClusterBy>{{"minhash", data::ClusterBy::kMinHash},
                                                 {"hash", data::ClusterBy::kHash},
                                                 {"source", data::ClusterBy::kSource}}));
  sub.add_option("--shard-tokens", o.shard_tokens, "tokens per shard file")->capture_default_str();
  sub.add_option("--jobs,--threads", o.threads,
                 "worker threads for the dedup and tokenize stages (0 = all cores); the output "
                 "does not depend on it")
      ->check(whole_at_least(0, "threads"))
      ->capture_default_str();
  sub.add_option("--seed", o.seed, "seed for MinHash, the split and keep-whole")
      ->capture_default_str();
}

// One prepare over many processes or machines (data/prepare_parts.h).
struct SplitOptions {
  int task = -1, tasks = 0;
  std::string merge;
};

void add_split_options(CLI::App& sub, SplitOptions& s) {
  sub.add_option("--task", s.task,
                 "with --tasks N: prepare only part I (0-based) of the input files, into "
                 "OUTPUT/part-I-of-N, for --merge (e.g. --task $SLURM_ARRAY_TASK_ID)");
  sub.add_option("--tasks", s.tasks, "the number of parts the input is split into (see --task)");
  sub.add_option("--merge", s.merge,
                 "PARTS: dedup over every part of PARTS (from --task runs) and write the dataset "
                 "to --output, as one prepare over the same inputs would");
}

// --merge takes everything from the parts: a dataset-shaping flag beside it would be ignored.
void refuse_flags_beside_merge(const CLI::App& sub) {
  for (const auto* opt : sub.get_options()) {
    const std::string name = opt->get_name();
    if (opt->count() == 0 || name == "--merge" || name == "--output" || name == "--overwrite" ||
        name == "--jobs" || name == "--help")
      continue;
    throw DataError(name + " with --merge: the parts' own options (from their --task runs, in " +
                    "part.json) make the dataset; --merge takes only --output, --overwrite and " +
                    "--jobs");
  }
}

// Runs the prepare the flags ask for: one process, a --task part, or a --merge.
nlohmann::json run_prepare(const data::PrepareOptions& o, const SplitOptions& s,
                           const CLI::App& sub) {
  if (!s.merge.empty()) {
    refuse_flags_beside_merge(sub);
    return data::merge_parts(s.merge, o);
  }
  if (o.inputs.empty())
    throw DataError("--input is required: the files, directories or globs to prepare (or " +
                    std::string("--merge PARTS to merge --task parts)"));
  if (s.task >= 0 || s.tasks > 0) {
    if (s.task < 0 || s.tasks < 1)
      throw DataError("--task and --tasks go together: --task I --tasks N with 0 <= I < N");
    return data::prepare_part(o, s.task, s.tasks);
  }
  return data::prepare(o);
}

// The command line as given, recorded in meta.json.
std::string command_line(const data::PrepareOptions& o, const CLI::App& sub) {
  std::string command = "keel prepare";
  for (const auto& in : o.inputs) command += " --input " + in;
  command += " --output " + o.output;
  if (sub.get_option("--merge")->count() == 0) command += " --tokenizer " + o.tokenizer.text();
  for (const auto* opt : sub.get_options()) {
    const std::string name = opt->get_name();
    if (opt->count() == 0 || name == "--input" || name == "--output" || name == "--tokenizer" ||
        name == "--help")
      continue;
    command += " " + name;
    if (name == "--cluster") {  // its results hold the enum's number, not the word given
      command += o.cluster == data::ClusterBy::kMinHash ? " minhash"
                 : o.cluster == data::ClusterBy::kHash  ? " hash"
                                                        : " source";
      continue;
    }
    for (const auto& r : opt->results()) command += " " + r;
  }
  return command;
}

}  // namespace

void register_prepare(CLI::App& app, int& exit_code) {
  auto o = std::make_shared<data::PrepareOptions>(data::recommended_prepare_options());
  auto shingle = std::make_shared<std::string>("word");
  auto scheme = std::make_shared<std::string>("keel");
  auto no_exact = std::make_shared<bool>(false);
  auto no_near = std::make_shared<bool>(false);
  auto tokenizer = std::make_shared<std::string>("byte");
  auto split = std::make_shared<SplitOptions>();
  auto* sub = app.add_subcommand("prepare",
                                 "turn raw text (files, dirs, globs; text, JSONL or parquet; "
                                 "gzip/zstd) into verified training shards");
  add_io_options(*sub, *o, *tokenizer);
  add_dedup_options(*sub, *o, *shingle, *scheme, *no_exact, *no_near);
  add_filter_and_packing_options(*sub, *o);
  add_split_options(*sub, *split);
  sub->footer(
      "Examples:\n"
      "  keel prepare --input corpus/ --output data/corpus                  # byte tokenizer, "
      "defaults\n"
      "  keel prepare --input 'dumps/*.jsonl.zst' --output data/web --tokenizer spm-train:8000\n"
      "  keel prepare --input /usr/share/games/fortunes --output data/fortunes --separator % "
      "--val-fraction 0.05\n"
      "  keel prepare --input corpus/ --output data/corpus --overwrite      # replace that "
      "dataset\n"
      "  keel prepare --input 'dumps/*.jsonl.zst' --output parts --task 0 --tasks 2  # part 1 "
      "of 2 (one machine)\n"
      "  keel prepare --input 'dumps/*.jsonl.zst' --output parts --task 1 --tasks 2  # part 2 "
      "of 2 (another)\n"
      "  keel prepare --merge parts --output data/dumps                     # the dataset from "
      "both");
  sub->callback([o, shingle, scheme, no_exact, no_near, tokenizer, split, &exit_code, sub] {
    log::init(0, 1);
    o->tokenizer = data::TokenizerSpec::parse(*tokenizer);
    o->minhash.char_shingles = *shingle == "char";
    if (*scheme == "datatrove") apply_datatrove_scheme(*sub, o->minhash);
    o->exact_dedup = !*no_exact;
    o->near_dedup = !*no_near;
    o->command = command_line(*o, *sub);
    monitor::Progress progress(config::Switch::kAuto, true);
    o->on_progress = prepare_progress_printer(progress);
    const auto report = run_prepare(*o, *split, *sub);
    progress.finish();
    if (split->task >= 0 && split->merge.empty()) {
      std::cout << "[data] " << o->output << "/" << data::part_name(split->task, split->tasks)
                << ": " << report["documents"] << " documents from "
                << report["files"][1].get<int64_t>() - report["files"][0].get<int64_t>()
                << " of the " << report["inputs"].size() << " input files; merge the "
                << split->tasks << " parts with: keel prepare --merge " << o->output
                << " --output DATASET\n";
      exit_code = 0;
      return;
    }
    std::cout << "[data] " << o->output << ": " << report["documents_in"] << " documents in, "
              << report["exact_duplicates"] << " exact and " << report["near_duplicates"]
              << " near duplicates, " << report["removed_by_length"] << " removed by length, "
              << report["removed_by_repetition"] << " by repetition, " << report["documents_out"]
              << " documents / " << report["tokens_out"] << " tokens out (report: " << o->output
              << "/report.txt)\n";
    exit_code = 0;
  });
}

}  // namespace keel::cli
