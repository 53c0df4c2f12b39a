// Checkpoint throughput beside the disk's own speed, measured in one run on the same directory:
//   raw write   one file, 64 MiB fwrite()s + fsync (what the disk gives a plain sequential writer)
//   raw read    the same file, page cache dropped first (posix_fadvise DONTNEED)
//   save sync   Checkpointer::save, checkpoint.async=false (the training stall is the whole save)
//   save async  checkpoint.async=true: the stall (copy to CPU) and the background write time
//   load cold   load_checkpoint (checksums verified in the same pass), page cache dropped first
//   load warm   the same, files in the page cache
//   verify      verify_checkpoint (hash every file), page cache dropped first
// Usage: keel_bench_checkpoint [--dir DIR] [--mb 200] [--reps 5]   (median and best of reps)
#include <ATen/CPUGeneratorImpl.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <string>
#include <vector>

#include "checkpoint/checkpointer.h"
#include "checkpoint/file_io.h"
#include "common/log.h"

namespace fs = std::filesystem;
using keel::checkpoint::CheckpointData;
using keel::checkpoint::Checkpointer;

namespace {

void rm_rf(const fs::path& p) {
  std::error_code ec;
  keel::checkpoint::remove_tree(p, ec);  // not fs::remove_all: see checkpoint/file_io.h
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double best(const std::vector<double>& v) { return *std::min_element(v.begin(), v.end()); }

void drop_cache(const fs::path& p) {
  auto drop = [](const fs::path& f) {
    int fd = ::open(f.c_str(), O_RDONLY);
    if (fd < 0) return;
    ::fdatasync(fd);
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  };
  if (fs::is_directory(p)) {
    for (const auto& de : fs::directory_iterator(p)) drop(de.path());
  } else {
    drop(p);
  }
}

double raw_write(const fs::path& file, const std::vector<char>& buf) {
  double t0 = now_s();
  FILE* f = std::fopen(file.c_str(), "wb");
  const size_t chunk = 64 << 20;
  for (size_t off = 0; off < buf.size(); off += chunk)
    std::fwrite(buf.data() + off, 1, std::min(chunk, buf.size() - off), f);
  std::fflush(f);
  ::fsync(fileno(f));
  std::fclose(f);
  return now_s() - t0;
}

double raw_read(const fs::path& file, std::vector<char>& buf) {
  drop_cache(file);
  double t0 = now_s();
  int fd = ::open(file.c_str(), O_RDONLY);
  size_t off = 0;
  ssize_t r;
  while ((r = ::read(fd, buf.data() + off, std::min<size_t>(64 << 20, buf.size() - off))) > 0)
    off += static_cast<size_t>(r);
  ::close(fd);
  return now_s() - t0;
}

}  // namespace

int main(int argc, char** argv) {
  fs::path dir = fs::temp_directory_path() / "keel_bench_checkpoint";
  int64_t mb = 200;
  int reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--dir")
      dir = argv[i + 1];
    else if (a == "--mb")
      mb = std::stoll(argv[i + 1]);
    else if (a == "--reps")
      reps = std::stoi(argv[i + 1]);
  }
  keel::log::init(1, 2);  // a quiet rank: the bench's own table only
  rm_rf(dir);
  fs::create_directories(dir);

  // A third model (fp32 weights), two thirds optimizer state (exp_avg, exp_avg_sq): 4 MiB tensors.
  torch::manual_seed(0);
  const int64_t per = 1 << 20;  // floats per tensor
  const int64_t n = std::max<int64_t>(3, mb * (1 << 20) / (per * 4));
  CheckpointData data;
  for (int64_t i = 0; i < n; ++i) {
    auto t = torch::randn({per});
    if (i % 3 == 0)
      data.model["layer" + std::to_string(i) + ".weight"] = t;
    else
      data.optimizer["state" + std::to_string(i)] = t;
  }
  data.extra_tensors["rng"] = at::detail::getDefaultCPUGenerator().get_state();
  data.trainer_state = {{"step", 0}};
  data.config_yaml = "model: {arch: llama}\n";
  const double bytes = static_cast<double>(n * per * 4);
  const double gb = bytes / 1e9;

  std::vector<char> buf(static_cast<size_t>(bytes));
  std::memcpy(buf.data(), data.model.begin()->second.data_ptr(),
              std::min<size_t>(buf.size(), per * 4));
  for (size_t i = per * 4; i < buf.size(); ++i) buf[i] = static_cast<char>(i * 2654435761u >> 13);

  keel::config::CheckpointConfig sync_cfg, async_cfg;
  async_cfg = sync_cfg;
  async_cfg.async = true;

  // Writes are interleaved, their order alternates between repetitions, each starts after sync(),
  // and nothing is deleted until the end (ext4 with `discard` trims on delete, which slows the next
  // writer): on a shared disk, what ran just before moves the figures more than anything.
  std::vector<double> w_raw, r_raw, s_sync, s_async_stall, s_async_write, l_cold, l_warm, v_cold;
  auto run_dir = [&](const char* kind, int rep) { return dir / (kind + std::to_string(rep)); };
  auto raw = [&](int rep) {
    fs::path f = dir / ("raw" + std::to_string(rep) + ".bin");
    ::sync();
    w_raw.push_back(raw_write(f, buf));
    r_raw.push_back(raw_read(f, buf));
  };
  auto sync_save = [&](int rep) {
    Checkpointer ck(run_dir("sync", rep), sync_cfg, 0, 1, "bench", "bench");
    ::sync();
    ck.save(rep, data);
    s_sync.push_back(ck.last_stall_seconds());
  };
  auto async_save = [&](int rep) {
    Checkpointer ck(run_dir("async", rep), async_cfg, 0, 1, "bench", "bench");
    ::sync();
    double t0 = now_s();
    ck.save(rep, data);
    s_async_stall.push_back(ck.last_stall_seconds());
    ck.wait();
    s_async_write.push_back(now_s() - t0);
  };
  for (int rep = 0; rep < reps; ++rep) {
    if (rep % 2 == 0) {
      raw(rep), sync_save(rep), async_save(rep);
    } else {
      async_save(rep), sync_save(rep), raw(rep);
    }
  }
  for (int rep = 0; rep < reps; ++rep) {
    fs::path ckpt = run_dir("sync", rep) / keel::checkpoint::step_dir_name(rep);
    drop_cache(ckpt);
    double t0 = now_s();
    auto loaded = keel::checkpoint::load_checkpoint(ckpt);
    l_cold.push_back(now_s() - t0);
    t0 = now_s();
    loaded = keel::checkpoint::load_checkpoint(ckpt);
    l_warm.push_back(now_s() - t0);
    drop_cache(ckpt);
    t0 = now_s();
    if (!keel::checkpoint::verify_checkpoint(ckpt).ok) return 1;
    v_cold.push_back(now_s() - t0);
  }
  auto row = [&](const char* what, const std::vector<double>& v, const char* note = "") {
    std::printf("| %-30s | %7.3f s | %6.2f GB/s | %6.2f GB/s | %-16s |\n", what, median(v),
                gb / median(v), gb / best(v), note);
  };
  std::printf(
      "checkpoint bench: %.0f MB of fp32 tensors (%lld x 4 MiB), dir %s, median and best of %d\n",
      bytes / 1e6, static_cast<long long>(n), dir.c_str(), reps);
  std::printf("| %-30s | %9s | %11s | %11s | %-16s |\n", "what", "median", "median", "best", "");
  std::printf("|%s|%s|%s|%s|%s|\n", std::string(32, '-').c_str(), std::string(11, '-').c_str(),
              std::string(13, '-').c_str(), std::string(13, '-').c_str(),
              std::string(18, '-').c_str());
  row("raw write (fwrite+fsync)", w_raw);
  row("raw read (cold)", r_raw);
  row("save, sync (= training stall)", s_sync);
  row("save, async: training stall", s_async_stall, "copy to CPU only");
  row("save, async: until written", s_async_write);
  row("load (cold, checksummed)", l_cold);
  row("load (warm, checksummed)", l_warm);
  row("verify (cold)", v_cold);
  rm_rf(dir);
  return 0;
}
