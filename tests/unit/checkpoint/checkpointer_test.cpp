// Checkpointer: atomic commit, manifest + checksums, fallback, retention, async, disk full.
#include "checkpoint/checkpointer.h"

#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <barrier>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <thread>

#include "checkpoint/file_io.h"
#include "checkpoint/tensor_file.h"
#include "checkpoint/weight_parts.h"
#include "checkpoint/weight_reader.h"
#include "common/error.h"
#include "scratch_dir.h"

namespace keel::checkpoint {
namespace {

namespace fs = std::filesystem;
using keel::testing::ScratchDir;

// Not std::filesystem::remove_all: it resolves to libtorch.so's copy and crashes (see file_io.h).
void rm_rf(const fs::path& p) {
  std::error_code ec;
  remove_tree(p, ec);
}

// A checkpoint directory is flat: copy its files (std::filesystem::copy is libtorch's too).
void copy_flat_dir(const fs::path& from, const fs::path& to) {
  fs::create_directories(to);
  for (const auto& de : fs::directory_iterator(from)) {
    std::ifstream in(de.path(), std::ios::binary);
    std::ofstream(to / de.path().filename(), std::ios::binary) << in.rdbuf();
  }
}

CheckpointData make_data(int64_t seed, int64_t model_floats = 1000) {
  torch::manual_seed(seed);
  CheckpointData d;
  d.model["embed.weight"] = torch::randn({model_floats / 10, 10});
  d.model["norm.weight"] = torch::randn({10}).to(torch::kBFloat16);
  d.optimizer["embed.weight.exp_avg"] = torch::randn({model_floats / 10, 10});
  d.optimizer["step"] = torch::tensor({seed});
  d.extra_tensors["rng.cpu"] = at::detail::getDefaultCPUGenerator().get_state();
  d.trainer_state = {{"step", seed}, {"tokens_seen", seed * 4096}, {"guard", {{"median", 1.5}}}};
  d.config_yaml = "model:\n  arch: llama\n  d_model: 64\n  n_layers: 2\n  vocab_size: 256\n";
  return d;
}

void expect_same(const std::map<std::string, torch::Tensor>& a,
                 const std::map<std::string, torch::Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [k, t] : a) {
    ASSERT_TRUE(b.count(k)) << k;
    const auto& u = b.at(k);
    ASSERT_EQ(t.scalar_type(), u.scalar_type()) << k;
    ASSERT_EQ(t.sizes(), u.sizes()) << k;
    auto tc = t.contiguous().cpu();
    auto uc = u.contiguous();
    EXPECT_EQ(std::memcmp(tc.data_ptr(), uc.data_ptr(), tc.nbytes()), 0) << k;
  }
}

void expect_same(const CheckpointData& a, const CheckpointData& b) {
  expect_same(a.model, b.model);
  expect_same(a.optimizer, b.optimizer);
  expect_same(a.extra_tensors, b.extra_tensors);
  EXPECT_EQ(a.trainer_state, b.trainer_state);
  EXPECT_EQ(a.config_yaml, b.config_yaml);
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

void flip_byte(const fs::path& p, uint64_t offset) {
  std::fstream f(p, std::ios::binary | std::ios::in | std::ios::out);
  f.seekg(static_cast<std::streamoff>(offset));
  char c;
  f.read(&c, 1);
  c ^= 0x10;
  f.seekp(static_cast<std::streamoff>(offset));
  f.write(&c, 1);
}

std::vector<std::string> entries(const fs::path& dir) {
  std::vector<std::string> out;
  for (const auto& de : fs::directory_iterator(dir)) out.push_back(de.path().filename().string());
  std::sort(out.begin(), out.end());
  return out;
}

pid_t dead_pid() {
  pid_t pid = fork();
  if (pid == 0) _exit(0);
  waitpid(pid, nullptr, 0);
  return pid;
}

class CheckpointerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    scratch_.emplace(std::string("ckpt_") +
                     ::testing::UnitTest::GetInstance()->current_test_info()->name());
    root_ = scratch_->path();
    dir_ = root_ / "checkpoints";
  }
  void TearDown() override { scratch_.reset(); }

  std::unique_ptr<Checkpointer> make(config::CheckpointConfig cfg = {}, fs::path dir = {}) {
    return std::make_unique<Checkpointer>(dir.empty() ? dir_ : dir, cfg, 0, 1, "0.1.0-test",
                                          "cfghash123");
  }
  std::string pointer(const char* name) { return slurp(dir_ / name); }

  std::optional<ScratchDir> scratch_;
  fs::path root_, dir_;
};

TEST_F(CheckpointerTest, SaveLoadRoundTripIsBitExact) {
  auto ck = make();
  CheckpointData data = make_data(7);
  fs::path p = ck->save(7, data);
  EXPECT_EQ(p, dir_ / "step_00000007");
  EXPECT_EQ(pointer("LATEST"), "step_00000007\n");
  EXPECT_FALSE(fs::exists(dir_ / "STABLE"));
  auto resolved = ck->resolve(Pointer::kLatest);
  ASSERT_TRUE(resolved);
  EXPECT_EQ(*resolved, p);
  expect_same(data, ck->load(*resolved));
  // Nothing but the checkpoint and its pointer: no temporary leftovers.
  EXPECT_EQ(entries(dir_), (std::vector<std::string>{"LATEST", "step_00000007"}));
  EXPECT_GE(ck->last_stall_seconds(), 0.0);
}

TEST_F(CheckpointerTest, ManifestListsEveryFileWithSizeAndChecksum) {
  auto ck = make();
  fs::path p = ck->save(3, make_data(3), /*stable=*/true);
  Manifest m = read_manifest(p);
  EXPECT_EQ(m.step, 3);
  EXPECT_EQ(m.world_size, 1);
  EXPECT_TRUE(m.stable);
  EXPECT_EQ(m.keel_version, "0.1.0-test");
  EXPECT_EQ(m.config_hash, "cfghash123");
  EXPECT_FALSE(m.created.empty());
  std::vector<std::string> names;
  for (const auto& [name, f] : m.files) {
    names.push_back(name);
    EXPECT_EQ(f.size, fs::file_size(p / name)) << name;
    EXPECT_EQ(f.xxh3, xxh3_hex(hash_file(p / name).xxh3)) << name;
  }
  EXPECT_EQ(names,
            (std::vector<std::string>{"config.yaml", "extra.rank0.safetensors", "model.safetensors",
                                      "optimizer.rank0.safetensors", "trainer_state.json"}));
  EXPECT_EQ(pointer("STABLE"), "step_00000003\n");
  EXPECT_TRUE(verify_checkpoint(p).ok);
  // model.safetensors is plain safetensors with the metadata Hugging Face expects.
  EXPECT_EQ(read_safetensors(p / "model.safetensors").metadata.at("format"), "pt");
}

TEST_F(CheckpointerTest, FlippedByteIsCaughtByVerifyAndLoad) {
  auto ck = make();
  fs::path p = ck->save(1, make_data(1));
  flip_byte(p / "model.safetensors", fs::file_size(p / "model.safetensors") - 100);  // a weight
  VerifyResult v = verify_checkpoint(p);
  EXPECT_FALSE(v.ok);
  EXPECT_NE(v.problem.find("model.safetensors"), std::string::npos) << v.problem;
  EXPECT_NE(v.problem.find("checksum mismatch"), std::string::npos) << v.problem;
  try {
    ck->load(p);
    FAIL() << "load accepted a corrupt checkpoint";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("model.safetensors: checksum mismatch"), std::string::npos)
        << e.what();
  }
  // A flip in the header, which the strict reader trips over first, still reads as corruption.
  fs::path q = ck->save(2, make_data(2));
  flip_byte(q / "model.safetensors", 12);
  try {
    ck->load(q);
    FAIL() << "load accepted a corrupt header";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("model.safetensors: checksum mismatch"), std::string::npos)
        << e.what();
  }
  // An explicitly named corrupt checkpoint is refused, not silently replaced.
  EXPECT_THROW(resolve_named_checkpoint(q), CheckpointError);
}

TEST_F(CheckpointerTest, ResolveLatestFallsBackToNewestThatVerifies) {
  auto ck = make();
  EXPECT_FALSE(ck->resolve(Pointer::kLatest));  // a fresh directory: nothing to resume
  CheckpointData d1 = make_data(1);
  ck->save(1, d1);
  ck->save(2, make_data(2));
  fs::path newest = ck->save(3, make_data(3));
  fs::remove(newest / "trainer_state.json");                               // newest: a file missing
  flip_byte(dir_ / "step_00000002" / "optimizer.rank0.safetensors", 200);  // second: corrupt
  auto r = ck->resolve(Pointer::kLatest);
  ASSERT_TRUE(r);
  EXPECT_EQ(*r, dir_ / "step_00000001");
  expect_same(d1, ck->load(*r));

  // A dangling pointer falls back the same way; a missing one too.
  std::ofstream(dir_ / "LATEST") << "step_00000099\n";
  EXPECT_EQ(ck->resolve(Pointer::kLatest), dir_ / "step_00000001");
  fs::remove(dir_ / "LATEST");
  EXPECT_EQ(ck->resolve(Pointer::kLatest), dir_ / "step_00000001");
  // The checkpoints directory itself is accepted as a path: its latest.
  EXPECT_EQ(resolve_named_checkpoint(dir_), dir_ / "step_00000001");
  EXPECT_THROW(resolve_named_checkpoint(dir_ / "step_00000042"), CheckpointError);
}

TEST_F(CheckpointerTest, ResolveStableOnlyUsesStableCheckpoints) {
  auto ck = make();
  EXPECT_FALSE(ck->resolve(Pointer::kStable));
  ck->save(1, make_data(1), true);
  ck->save(2, make_data(2));
  ck->save(3, make_data(3));
  EXPECT_EQ(ck->resolve(Pointer::kStable), dir_ / "step_00000001");
  ck->promote_to_stable(3);
  EXPECT_TRUE(read_manifest(dir_ / "step_00000003").stable);
  EXPECT_TRUE(verify_checkpoint(dir_ / "step_00000003").ok);
  EXPECT_EQ(pointer("STABLE"), "step_00000003\n");
  EXPECT_EQ(ck->resolve(Pointer::kStable), dir_ / "step_00000003");
  // Stable target corrupt: the older stable one, never the newer non-stable step 2.
  flip_byte(dir_ / "step_00000003" / "model.safetensors", 300);
  EXPECT_EQ(ck->resolve(Pointer::kStable), dir_ / "step_00000001");
  EXPECT_THROW(ck->promote_to_stable(3), CheckpointError);  // a corrupt one is never promoted
}

TEST_F(CheckpointerTest, RetentionKeepsLastAndStableAndPointerTargets) {
  config::CheckpointConfig cfg;
  cfg.keep_last = 2;
  cfg.stable.keep = 1;
  auto ck = make(cfg);
  for (int64_t s = 1; s <= 6; ++s) {
    ck->save(s, make_data(s, 100), /*stable=*/s == 2 || s == 4);
    // Invariant after every save: the pointers name checkpoints that exist and verify.
    EXPECT_TRUE(verify_checkpoint(dir_ / slurp(dir_ / "LATEST").substr(0, 13)).ok);
    if (fs::exists(dir_ / "STABLE"))
      EXPECT_TRUE(verify_checkpoint(dir_ / slurp(dir_ / "STABLE").substr(0, 13)).ok);
  }
  EXPECT_EQ(entries(dir_), (std::vector<std::string>{"LATEST", "STABLE", "step_00000004",
                                                     "step_00000005", "step_00000006"}));
  ck->save(7, make_data(7, 100), true);  // stable.keep = 1: step 4 goes
  EXPECT_FALSE(fs::exists(dir_ / "step_00000004"));
  // A pointer target outside both windows survives: the guard promotes the older step 5, so
  // STABLE names it while step 7 is the newest stable one.
  ck->promote_to_stable(5);
  ck->save(8, make_data(8, 100));
  EXPECT_EQ(entries(dir_),
            (std::vector<std::string>{"LATEST", "STABLE", "step_00000005", "step_00000006",
                                      "step_00000007", "step_00000008"}));
  EXPECT_EQ(pointer("STABLE"), "step_00000005\n");
}

TEST_F(CheckpointerTest, TmpDirsAreInvisibleAndStaleOnesAreCleaned) {
  {
    auto ck = make();
    ck->save(1, make_data(1));
  }
  // A killed writer's directory (dead pid) and a live writer's (pid 1 is always alive), both with
  // a complete-looking copy of a checkpoint inside.
  fs::path stale = dir_ / ("step_00000005.tmp-" + std::to_string(dead_pid()));
  fs::path live = dir_ / "step_00000006.tmp-1";
  copy_flat_dir(dir_ / "step_00000001", stale);
  copy_flat_dir(dir_ / "step_00000001", live);
  fs::remove(dir_ / "LATEST");
  EXPECT_EQ(resolve_checkpoint(dir_, Pointer::kLatest), dir_ / "step_00000001");  // never a tmp dir
  auto ck = make();  // construction cleans up
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_TRUE(fs::exists(live));
  ck->save(2, make_data(2));
  EXPECT_TRUE(fs::exists(live));
  EXPECT_EQ(entries(dir_), (std::vector<std::string>{"LATEST", "step_00000001", "step_00000002",
                                                     "step_00000006.tmp-1"}));
}

TEST_F(CheckpointerTest, SavingAnExistingStepReplacesIt) {
  auto ck = make();
  ck->save(5, make_data(1));
  CheckpointData second = make_data(2);
  ck->save(5, second);
  expect_same(second, ck->load(dir_ / "step_00000005"));
  EXPECT_EQ(entries(dir_), (std::vector<std::string>{"LATEST", "step_00000005"}));
}

TEST_F(CheckpointerTest, AsyncSaveWritesSameFilesAsSyncAndWaits) {
  config::CheckpointConfig async_cfg;
  async_cfg.async = true;
  auto sync = make({}, root_ / "sync");
  auto async = make(async_cfg, root_ / "async");
  CheckpointData data = make_data(11, 200000);
  CheckpointData expected = make_data(11, 200000);
  sync->save(11, data);
  async->save(11, data);
  // The async save copied the tensors: training may update them in place at once.
  for (auto& [k, t] : data.model) t.zero_();
  CheckpointData second = make_data(12, 200000);
  async->save(12, second);  // waits for step 11 first
  async->wait();
  expect_same(expected, async->load(root_ / "async" / "step_00000011"));
  expect_same(second, async->load(root_ / "async" / "step_00000012"));
  Manifest ms = read_manifest(root_ / "sync" / "step_00000011");
  Manifest ma = read_manifest(root_ / "async" / "step_00000011");
  ASSERT_EQ(ms.files.size(), ma.files.size());
  for (const auto& [name, f] : ms.files) {
    EXPECT_EQ(f.xxh3, ma.files.at(name).xxh3) << name;
    EXPECT_EQ(slurp(root_ / "sync" / "step_00000011" / name),
              slurp(root_ / "async" / "step_00000011" / name))
        << name;
  }
  EXPECT_EQ(slurp(root_ / "async" / "LATEST"), "step_00000012\n");
  EXPECT_GT(async->last_write_seconds(), 0.0);
}

TEST_F(CheckpointerTest, AsyncErrorIsRethrownAtWait) {
  config::CheckpointConfig cfg;
  cfg.async = true;
  auto ck = make(cfg);
  ck->save(1, make_data(1));
  ck->wait();
  // The checkpoints directory turns into a file: the background write must fail.
  rm_rf(dir_);
  std::ofstream(dir_) << "not a directory";
  EXPECT_NO_THROW(ck->save(2, make_data(2)));
  EXPECT_THROW(ck->wait(), CheckpointError);
  EXPECT_NO_THROW(ck->wait());  // reported once
}

TEST_F(CheckpointerTest, DiskFullThrowsAndKeepsEarlierCheckpoints) {
  fs::create_directories(dir_);
  if (::mount("tmpfs", dir_.c_str(), "tmpfs", 0, "size=1m") != 0)
    GTEST_SKIP() << "cannot mount a 1 MiB tmpfs here (needs root): " << std::strerror(errno);
  struct Unmount {
    fs::path p;
    ~Unmount() { ::umount2(p.c_str(), MNT_DETACH); }
  } unmount{dir_};
  auto ck = make();
  CheckpointData d1 = make_data(1, 20000), d2 = make_data(2, 20000);  // ~160 KB each
  ck->save(1, d1);
  ck->save(2, d2);
  try {
    ck->save(3, make_data(3, 400000));  // ~3.2 MB: cannot fit
    FAIL() << "a save larger than the disk succeeded";
  } catch (const CheckpointError& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find("No space left on device"), std::string::npos) << msg;
    EXPECT_NE(msg.find("step_00000003.tmp-"), std::string::npos) << msg;  // names the file
  }
  EXPECT_EQ(entries(dir_), (std::vector<std::string>{"LATEST", "step_00000001", "step_00000002"}));
  EXPECT_EQ(pointer("LATEST"), "step_00000002\n");
  expect_same(d2, ck->load(*ck->resolve(Pointer::kLatest)));
  expect_same(d1, ck->load(dir_ / "step_00000001"));
  ck->save(4, make_data(4, 20000));  // space was given back: the next save works
  EXPECT_EQ(pointer("LATEST"), "step_00000004\n");
}

TEST_F(CheckpointerTest, MultiRankCommitsAfterEveryRankWrote) {
  std::barrier sync_point(2);
  auto barrier = [&] { sync_point.arrive_and_wait(); };
  config::CheckpointConfig cfg;
  Checkpointer r0(dir_, cfg, 0, 2, "0.1.0-test", "h", barrier);
  Checkpointer r1(dir_, cfg, 1, 2, "0.1.0-test", "h", barrier);
  CheckpointData d0 = make_data(1), d1 = make_data(2);
  d1.model.clear();  // only rank 0 writes the model
  std::thread t1([&] { r1.save(10, d1); });
  r0.save(10, d0);
  t1.join();
  fs::path p = dir_ / "step_00000010";
  Manifest m = read_manifest(p);
  EXPECT_EQ(m.world_size, 2);
  for (const char* f : {"optimizer.rank0.safetensors", "optimizer.rank1.safetensors",
                        "extra.rank1.safetensors", "files.rank1.json", "model.safetensors"})
    EXPECT_TRUE(m.files.count(f)) << f;
  EXPECT_TRUE(verify_checkpoint(p).ok) << verify_checkpoint(p).problem;
  CheckpointData back1 = r1.load(p);
  expect_same(d1.optimizer, back1.optimizer);
  expect_same(d0.model, back1.model);
  expect_same(d0.optimizer, r0.load(p).optimizer);
  // Another world size reads the rank of the same number modulo the writer's: 1 rank reads
  // rank 0's optimizer, rank 3 of 4 reads rank 1's.
  expect_same(d0.optimizer, load_checkpoint(p, 0, 1).optimizer);
  expect_same(d1.optimizer, load_checkpoint(p, 3, 4).optimizer);
}

// The weights of a checkpoint read one parameter, or one range of it, at a time: from a whole
// model.safetensors (bf16 read as fp32) or from two ranks' parts cut anywhere; a corrupt part is
// refused before anything is read from it.
TEST_F(CheckpointerTest, WeightReaderReadsRangesFromWholeWeightsOrParts) {
  CheckpointData whole = make_data(3);
  make()->save(1, whole);
  const WeightReader plain(dir_ / "step_00000001");
  EXPECT_EQ(plain.shapes().at("embed.weight"), (std::vector<int64_t>{100, 10}));
  EXPECT_TRUE(torch::equal(plain.read("embed.weight"), whole.model.at("embed.weight")));
  EXPECT_TRUE(
      torch::equal(plain.read("norm.weight"), whole.model.at("norm.weight").to(torch::kFloat)));
  EXPECT_TRUE(torch::equal(plain.read("embed.weight", 95, 20),
                           whole.model.at("embed.weight").reshape({-1}).narrow(0, 95, 20)));

  std::barrier sync_point(2);
  auto barrier = [&] { sync_point.arrive_and_wait(); };
  const fs::path parts_dir = root_ / "parts";
  Checkpointer r0(parts_dir, {}, 0, 2, "0.1.0-test", "h", barrier);
  Checkpointer r1(parts_dir, {}, 1, 2, "0.1.0-test", "h", barrier);
  const torch::Tensor w = torch::randn({7, 9});
  const torch::Tensor flat = w.reshape({-1});
  CheckpointData d0 = make_data(1), d1 = make_data(2);
  d0.model = {{piece_key("w", 0), flat.narrow(0, 0, 40).clone()},
              {shape_key("w"), torch::tensor(w.sizes().vec(), torch::kInt64)}};
  d1.model = {{piece_key("w", 40), flat.narrow(0, 40, 23).clone()}};
  d0.model_in_parts = d1.model_in_parts = true;
  std::thread t1([&] { r1.save(4, d1); });
  r0.save(4, d0);
  t1.join();
  const fs::path step = parts_dir / "step_00000004";
  const WeightReader parts(step);
  EXPECT_EQ(parts.shapes().at("w"), (std::vector<int64_t>{7, 9}));
  EXPECT_TRUE(torch::equal(parts.read("w"), w));
  EXPECT_TRUE(torch::equal(parts.read("w", 35, 10), flat.narrow(0, 35, 10)));
  EXPECT_THROW(parts.read("absent"), CheckpointError);
  flip_byte(step / "model.rank1.safetensors", fs::file_size(step / "model.rank1.safetensors") - 3);
  try {
    WeightReader corrupt(step);
    FAIL() << "a corrupt part was read";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("model.rank1.safetensors"), std::string::npos) << e.what();
  }
}

// Rollback from memory (issue 50): with a memory limit the newest stable snapshot is held in host
// memory and load_newest(kStable) hands out a copy of it, equal to what the disk holds, without
// reading the disk; a checkpoint promoted later is held as well; the copy is the caller's (the
// held one is untouched when it is modified); once STABLE names a snapshot not held, or the held
// one was moved away, or without a limit, the disk is read.
TEST_F(CheckpointerTest, TheStableSnapshotIsRestoredFromMemoryWhereItIsHeld) {
  for (const bool async : {false, true}) {
    config::CheckpointConfig cfg;
    cfg.async = async;
    const fs::path dir = dir_ / (async ? "async" : "sync");
    auto ck = make(cfg, dir);
    ck->set_memory_limit(64 << 20);
    const CheckpointData one = make_data(1), two = make_data(2);
    ck->save(1, one, /*stable=*/true);
    auto held = ck->load_newest(Pointer::kStable);
    ASSERT_TRUE(held);
    EXPECT_TRUE(held->from_memory);
    EXPECT_EQ(held->path.filename(), "step_00000001");
    expect_same(held->data, one);
    expect_same(held->data, ck->load(held->path));  // what the disk holds
    held->data.model["embed.weight"].add_(1.0f);    // the caller's copy
    expect_same(ck->load_newest(Pointer::kStable)->data, one);

    ck->save(2, two);  // a candidate, held beside the snapshot
    ck->promote_to_stable(2);
    held = ck->load_newest(Pointer::kStable);
    ASSERT_TRUE(held);
    EXPECT_TRUE(held->from_memory);
    EXPECT_EQ(held->path.filename(), "step_00000002");
    expect_same(held->data, two);
    // A back-off to before step 2 reads step 1 from the disk.
    held = ck->load_newest(Pointer::kStable, 1);
    ASSERT_TRUE(held);
    EXPECT_FALSE(held->from_memory);
    expect_same(held->data, one);

    // Moved away (an abandoned timeline after step 1): the held copy is not the one to restore.
    ck->abandon_after(1);
    held = ck->load_newest(Pointer::kStable);
    ASSERT_TRUE(held);
    EXPECT_FALSE(held->from_memory);
    expect_same(held->data, one);

    auto no_memory = make(cfg, dir_ / (async ? "async0" : "sync0"));
    no_memory->save(1, one, true);
    EXPECT_FALSE(no_memory->load_newest(Pointer::kStable)->from_memory);
    // A limit smaller than the checkpoint holds nothing.
    auto small = make(cfg, dir_ / (async ? "async1" : "sync1"));
    small->set_memory_limit(1024);
    small->save(1, one, true);
    EXPECT_FALSE(small->load_newest(Pointer::kStable)->from_memory);
  }
}

}  // namespace
}  // namespace keel::checkpoint
