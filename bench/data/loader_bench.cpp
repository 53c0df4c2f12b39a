// Loader throughput at training shapes: micro-batches/s and tokens/s the shard loader serves
// when the consumer takes them as fast as it can, for 1 and 2 producer workers, against a
// trainer consumption rate given on the command line (keel's measured tokens/s). The headroom
// (served / consumed) says how far the loader is from becoming the bottleneck; loader_wait_ms in a
// run's metrics is the same thing seen from the trainer.
//
//   keel_bench_loader DATA_DIR [--batch 16] [--seq 1024] [--seconds 5] [--consumes TOKENS_PER_S]...
//
// DATA_DIR is a `keel prepare` output directory (bench/data/loader_bench.sh prepares one).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "config/schema.h"
#include "data/loader.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string dir;
  int64_t batch = 16, seq = 1024;
  double seconds = 5.0;
  std::vector<double> consumes;  // trainer tokens/s to compare against
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    auto value = [&] {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", s.c_str());
        std::exit(2);
      }
      return std::string(argv[++i]);
    };
    if (s == "--batch")
      a.batch = std::stoll(value());
    else if (s == "--seq")
      a.seq = std::stoll(value());
    else if (s == "--seconds")
      a.seconds = std::stod(value());
    else if (s == "--consumes")
      a.consumes.push_back(std::stod(value()));
    else if (a.dir.empty() && s[0] != '-')
      a.dir = s;
    else {
      std::fprintf(stderr,
                   "usage: keel_bench_loader DATA_DIR [--batch B] [--seq T] [--seconds S] "
                   "[--consumes TOKENS_PER_S]...\n");
      std::exit(2);
    }
  }
  if (a.dir.empty()) {
    std::fprintf(stderr, "keel_bench_loader: DATA_DIR is required\n");
    std::exit(2);
  }
  return a;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = parse(argc, argv);
  std::printf("loader: B=%lld, T=%lld, stratified sampling, memory-mapped shards in %s\n",
              static_cast<long long>(args.batch), static_cast<long long>(args.seq),
              args.dir.c_str());
  for (int workers : {1, 2}) {
    keel::data::LoaderOptions o;
    o.dir = args.dir;
    o.seq_len = args.seq;
    o.sampler.kind = keel::config::Sampling::kStratified;
    o.sampler.seed = 1234;
    o.sampler.micro_batch = args.batch;
    o.sampler.buckets = 16;
    o.sampler.min_clusters = 2;
    o.loader.workers = workers;
    keel::data::ShardLoader loader(o);
    for (int i = 0; i < 8; ++i) loader.next();  // threads started, queue warm
    const auto t0 = Clock::now();
    int64_t n = 0;
    double elapsed = 0;
    while (elapsed < args.seconds) {
      auto b = loader.next();
      if (b.tokens.size(0) != args.batch) return 1;
      ++n;
      elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
    }
    const double batches = n / elapsed;
    const double tokens = batches * static_cast<double>(args.batch * args.seq);
    std::printf("  %d worker(s): %.0f micro-batches/s = %.3g tokens/s (%.1f us per batch)\n",
                workers, batches, tokens, 1e6 / batches);
    for (double c : args.consumes)
      std::printf("    against a trainer consuming %.3g tokens/s: %.0fx headroom\n", c, tokens / c);
  }
  return 0;
}
