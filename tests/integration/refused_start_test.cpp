// A refused start writes nothing (issue 32): every check that can refuse a `keel train` runs
// before the run directory, config.resolved.yaml, events.jsonl or starts.jsonl is touched, so a
// refused resume leaves a finished run byte for byte as it was (and its report still says
// finished), and a refused start in an empty or missing directory creates nothing.
// `keel prepare` refuses a non-empty --output unless --overwrite, and with --overwrite a kill -9
// at any moment leaves the old dataset or the new one.
#include <gtest/gtest.h>
#include <signal.h>

#include <map>
#include <random>
#include <regex>

#include "harness.h"

namespace keel::testing {
namespace {
namespace fs = std::filesystem;

// Every file under `dir` (relative path -> bytes); directories as "path/" -> "".
std::map<std::string, std::string> tree(const fs::path& dir) {
  std::map<std::string, std::string> out;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec);
       it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const auto rel = fs::relative(it->path(), dir).string();
    if (it->is_directory()) {
      out[rel + "/"] = "";
    } else {
      std::ifstream in(it->path(), std::ios::binary);
      out[rel] = std::string(std::istreambuf_iterator<char>(in), {});
    }
  }
  return out;
}

std::string quick_train(const std::string& run_dir, const std::string& extra = "") {
  return "train " + source_path("configs/tiny.yaml") + kQuickRun +
         " --set run.max_steps=8 --set checkpoint.every_steps=4 --run-dir " + run_dir + extra;
}

// A small raw corpus: `docs` distinct documents of random words, one JSONL record each.
void write_corpus(const fs::path& dir, int docs, uint32_t seed) {
  fs::create_directories(dir);
  std::mt19937 rng(seed);
  static const char* const kWords[] = {"stable", "training", "loss",  "spike",    "data",
                                       "window", "rollback", "norm",  "gradient", "shard",
                                       "token",  "warmup",   "decay", "median",   "batch"};
  std::ofstream out(dir / "docs.jsonl");
  for (int d = 0; d < docs; ++d) {
    std::string text = "doc " + std::to_string(d) + ":";
    const int words = 40 + static_cast<int>(rng() % 200);
    for (int w = 0; w < words; ++w) text += std::string(" ") + kWords[rng() % 15];
    out << nlohmann::json{{"text", text}}.dump() << "\n";
  }
}

// The report page of a run, its "written at" minute left out.
std::string report_html(const fs::path& run_dir, const fs::path& out) {
  auto r = run_keel("report " + run_dir.string() + " -o " + out.string());
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::ifstream in(out, std::ios::binary);
  const std::string page(std::istreambuf_iterator<char>(in), {});
  static const std::regex kStamp(R"(\d{4}-\d\d-\d\d \d\d:\d\d UTC)");
  return std::regex_replace(page, kStamp, "TIME");
}

TEST(RefusedStart, ARefusedResumeLeavesAFinishedRunByteIdentical) {
  ScratchDir d("refused_resume");
  const std::string run = d / "run";
  auto r = run_keel(quick_train(run));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto before = tree(run);
  const std::string report_before = report_html(run, d.path() / "before.html");
  ASSERT_NE(report_before.find("finished"), std::string::npos);

  struct Case {
    std::string args, says;
  };
  const std::vector<Case> cases = {
      {" --resume latest --set model.n_layers=3", "model.n_layers"},
      {" --resume latset", "did you mean latest"},
      {" --resume stabel", "did you mean stable"},
      {" --resume " + d / "no_such_checkpoint", "no such directory"},
      {" --resume latest --set data.path=" + d / "missing" + " --set data.source=shards",
       "does not exist"},
      {" --resume latest --init-from " + d / "no_hf_model", "no such directory"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.args);
    auto refused = run_keel(quick_train(run, c.args));
    EXPECT_EQ(refused.exit_code, 2) << refused.output;
    EXPECT_NE(refused.output.find(c.says), std::string::npos) << refused.output;
    EXPECT_TRUE(tree(run) == before) << "the run directory changed";
  }
  EXPECT_EQ(report_html(run, d.path() / "after.html"), report_before);

  // The same run still resumes: nothing it needs was touched.
  r = run_keel(quick_train(run, " --resume latest --set run.max_steps=10"));
  EXPECT_EQ(r.exit_code, 0) << r.output;
}

TEST(RefusedStart, MissingDataRefusesAResumeBeforeWritingAndNamesTheDirectory) {
  ScratchDir d("refused_data");
  write_corpus(d.path() / "raw", 300, 7);
  const std::string data = d / "data";
  auto r = run_keel("prepare --input " + d / "raw" + " --output " + data +
                    " --val-fraction 0.1 --seq-len 32");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const std::string on_shards = " --set data.source=shards --set data.path=" + data +
                                " --set model.vocab_size=auto --set data.micro_batch_size=4";
  const std::string run = d / "run";
  r = run_keel(quick_train(run, on_shards));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto before = tree(run);

  fs::rename(data, d / "data_moved");
  auto refused = run_keel(quick_train(run, on_shards + " --resume latest"));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(refused.output.find(data), std::string::npos) << refused.output;
  EXPECT_TRUE(tree(run) == before) << "the run directory changed";

  // Raw text given as data.path: the hint prepares it elsewhere, never into the corpus itself.
  fs::rename(d / "data_moved", data);
  const std::string raw_run = d / "raw_run";
  refused = run_keel(quick_train(raw_run, " --set data.source=shards --set data.path=" + d / "raw" +
                                              " --set model.vocab_size=264"));
  EXPECT_EQ(refused.exit_code, 2) << refused.output;
  EXPECT_NE(
      refused.output.find("keel prepare --input " + d / "raw" + " --output " + d / "raw-prepared"),
      std::string::npos)
      << refused.output;
  EXPECT_FALSE(fs::exists(raw_run));
}

TEST(RefusedStart, ARefusedStartInAnEmptyOrMissingDirectoryCreatesNothing) {
  ScratchDir d("refused_empty");
  const std::string missing = d / "never_made";
  const std::vector<std::string> refusals = {
      " --resume latset",
      " --set data.source=shards --set data.path=" + d / "no_data",
      " --init-from " + d / "no_hf_model",
  };
  fs::create_directories(d.path() / "empty");
  for (const auto& args : refusals) {
    SCOPED_TRACE(args);
    auto r = run_keel(quick_train(missing, args));
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_FALSE(fs::exists(missing));
    r = run_keel(quick_train(d / "empty", args));
    EXPECT_EQ(r.exit_code, 2) << r.output;
    EXPECT_TRUE(fs::is_empty(d.path() / "empty"));
  }
  // CUDA graphs demanded where none can run: refused, naming the key and why.
  auto r = run_keel(quick_train(missing, " --set run.device=cpu --set run.cuda_graphs=on"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("run.cuda_graphs: on, but the run is on cpu"), std::string::npos)
      << r.output;
  EXPECT_FALSE(fs::exists(missing));
  // A relative path that is not there names the working directory it was looked for in.
  r = run_shell("cd " + d.str() + " && " + keel::testing::kKeelBinary + " " +
                quick_train("run", " --resume nowhere/step_00000004"));
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("relative to " + d.str()), std::string::npos) << r.output;
}

TEST(PrepareOutput, ANonEmptyOutputIsRefusedAndLeftAsItWas) {
  ScratchDir d("prepare_refused");
  write_corpus(d.path() / "a", 200, 1);
  write_corpus(d.path() / "b", 200, 2);
  const std::string out = d / "data";
  auto r = run_keel("prepare --input " + d / "a" + " --output " + out);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto before = tree(out);

  r = run_keel("prepare --input " + d / "b" + " --output " + out);
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("not empty"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("meta.json"), std::string::npos) << r.output;  // names what is there
  EXPECT_NE(r.output.find("--overwrite"), std::string::npos) << r.output;
  EXPECT_TRUE(tree(out) == before);

  // Into the raw corpus itself: refused the same way, the corpus untouched.
  const auto corpus = tree(d.path() / "b");
  r = run_keel("prepare --input " + d / "b" + " --output " + d / "b");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_TRUE(tree(d.path() / "b") == corpus);

  // Raw text kept inside the dataset directory would go with the dataset --overwrite replaces.
  write_corpus(fs::path(out) / "raw", 50, 5);
  const auto with_raw = tree(out);
  r = run_keel("prepare --input " + out + "/raw --output " + out + " --overwrite");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("lies inside --output"), std::string::npos) << r.output;
  EXPECT_TRUE(tree(out) == with_raw);
  fs::rename(fs::path(out) / "raw", d.path() / "raw_moved");
  // The working directory itself cannot be renamed onto.
  r = run_shell("cd " + out + " && " + keel::testing::kKeelBinary + " prepare --input " + d / "b" +
                " --output . --overwrite");
  EXPECT_EQ(r.exit_code, 2) << r.output;
  EXPECT_NE(r.output.find("the working directory"), std::string::npos) << r.output;
  EXPECT_TRUE(tree(out) == before);

  r = run_keel("prepare --input " + d / "b" + " --output " + out + " --overwrite");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_FALSE(tree(out) == before);
  for (const auto& e : fs::directory_iterator(d.path()))  // no staging directory left behind
    EXPECT_EQ(e.path().filename().string().find(".tmp-"), std::string::npos) << e.path();
}

// The shards of a dataset (what training reads), by name.
std::map<std::string, std::string> shards_of(const fs::path& dir) {
  std::map<std::string, std::string> out;
  for (auto& [name, bytes] : tree(dir))
    if (name.ends_with(".bin") || name.ends_with(".idx")) out[name] = bytes;
  return out;
}

TEST(PrepareOutput, OverwriteKilledAtAnyMomentLeavesTheOldDatasetOrTheNew) {
  ScratchDir d("prepare_kill");
  write_corpus(d.path() / "old_raw", 300, 3);
  write_corpus(d.path() / "new_raw", 12000, 4);
  const std::string flags = " --no-near-dedup --val-fraction 0.05 --threads 1";
  // The new dataset as an uninterrupted prepare writes it.
  auto r = run_keel("prepare --input " + d / "new_raw" + " --output " + d / "reference" + flags);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto reference = shards_of(d.path() / "reference");
  ASSERT_FALSE(reference.empty());

  const std::string out = d / "data";
  r = run_keel("prepare --input " + d / "old_raw" + " --output " + out + flags);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const auto old = tree(out);
  int old_seen = 0, new_seen = 0;
  for (int delay_ms : {50, 300, 800, 1500, 3000, 6000}) {
    SCOPED_TRACE(delay_ms);
    const std::string cmd = std::string(keel::testing::kKeelBinary) + " prepare --input " +
                            d / "new_raw" + " --output " + out + flags + " --overwrite > " +
                            d / "log" + " 2>&1 & echo $!";
    std::FILE* p = popen(cmd.c_str(), "r");
    ASSERT_NE(p, nullptr);
    int pid = 0;
    ASSERT_EQ(std::fscanf(p, "%d", &pid), 1);
    pclose(p);
    std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
    ::kill(pid, SIGKILL);
    for (int i = 0; i < 100 && ::kill(pid, 0) == 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const auto now = tree(out);
    if (now == old) {
      ++old_seen;
      continue;
    }
    // Not the old one: then the whole new one, shard for shard, and it opens for training.
    EXPECT_TRUE(shards_of(out) == reference) << "a dataset that is neither old nor new";
    ++new_seen;
    auto check = run_keel(quick_train(d / "on_new",
                                      " --set data.source=shards --set "
                                      "model.vocab_size=auto --set data.path=" +
                                          out));
    EXPECT_EQ(check.exit_code, 0) << check.output;
    break;  // the new dataset is in place; later kills would only see it again
  }
  EXPECT_GT(old_seen, 0);  // the kill landed before the swap at least once
  // A later prepare clears what the killed ones left beside the output.
  r = run_keel("prepare --input " + d / "old_raw" + " --output " + out + flags + " --overwrite");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  for (const auto& e : fs::directory_iterator(d.path()))
    EXPECT_EQ(e.path().filename().string().find("data.tmp-"), std::string::npos) << e.path();
  std::cout << "kills that left the old dataset: " << old_seen << ", the new one: " << new_seen
            << "\n";
}

}  // namespace
}  // namespace keel::testing
