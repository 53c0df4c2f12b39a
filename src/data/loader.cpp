#include "data/loader.h"

#include <chrono>
#include <cmath>
#include <mutex>
#include <set>

#include "common/error.h"
#include "common/log.h"
#include "data/foreign_formats.h"

namespace keel::data {
namespace {

using Clock = std::chrono::steady_clock;

double unit_hash(uint64_t seed, int64_t position) {
  uint64_t v[2] = {seed ^ 0xD5A7u, static_cast<uint64_t>(position)};
  return static_cast<double>(xxh3(v, sizeof v) >> 11) * 0x1.0p-53;
}

// A dataset's train and val loaders read the same meta.json: what it says about the dataset as
// a whole is said once per directory, not once per split.
bool first_open_in_process(const std::string& dir) {
  static std::mutex mutex;
  static std::set<std::string> opened;
  std::lock_guard<std::mutex> lock(mutex);
  return opened.insert(dir).second;
}

}  // namespace

ShardLoader::ShardLoader(LoaderOptions options) : options_(std::move(options)) {
  auto& o = options_;
  if (o.seq_len < 1) throw ConfigError("model.seq_len must be positive");
  if (o.world_size < 1 || o.rank < 0 || o.rank >= o.world_size)
    throw std::invalid_argument("ShardLoader: rank outside the world");
  o.grad_accum_steps = std::max<int64_t>(o.grad_accum_steps, 1);
  o.loader.workers = std::max<int64_t>(o.loader.workers, 1);
  o.loader.queue_capacity = std::max<int64_t>(o.loader.queue_capacity, 1);
  o.loader.high_watermark =
      std::clamp<int64_t>(o.loader.high_watermark, 1, o.loader.queue_capacity);
  o.loader.low_watermark = std::clamp<int64_t>(o.loader.low_watermark, 0, o.loader.high_watermark);

  set_ = o.source == config::DataSource::kShards
             ? ShardSet::open(o.dir, o.split)
             : open_foreign({o.source, o.dir, o.split, o.held_out, o.model_vocab_size});
  const auto& meta = set_->meta();
  if (o.model_vocab_size > 0 && meta.vocab_size > o.model_vocab_size)
    throw DataError(o.dir + "/meta.json: the data's vocabulary has " +
                    std::to_string(meta.vocab_size) + " ids but model.vocab_size is " +
                    std::to_string(o.model_vocab_size) +
                    "; HINT: set model.vocab_size >= " + std::to_string(meta.vocab_size));
  if (meta.seq_len > 0 && meta.seq_len != o.seq_len && first_open_in_process(o.dir))
    log::info("data",
              "{}: prepared for seq_len {}, training with {} (only keep-whole packing "
              "depends on it)",
              o.dir, meta.seq_len, o.seq_len);
  tokenizer_ = tokenizer_from_meta(meta.tokenizer, o.dir);
  if (o.source == config::DataSource::kShards)
    provenance_ = Provenance::open(o.dir, meta.provenance);

  // Window w starts at stream position w*T; its bucket is that of the document there.
  const int64_t T = o.seq_len;
  int64_t windows = set_->num_tokens() > 1 ? (set_->num_tokens() - 1) / T : 0;
  std::vector<uint32_t> bucket(windows, 0);
  const auto& docs = set_->documents();
  for (int64_t w = 0; w < windows; ++w) {
    int64_t d = set_->document_at(w * T);
    bucket[w] = d >= 0 ? docs[d].cluster : 0;
  }
  // What the log lines and errors call this data: its role, not the split's name (a
  // data.val_path dataset without a val split is read from its train split).
  const char* const role = o.validation ? "validation" : "train";
  if (o.validation && windows < o.sampler.micro_batch * o.world_size && windows >= o.world_size) {
    // A small val split still evaluates: on fewer sequences per batch, the same ones every time.
    o.sampler.micro_batch = windows / o.world_size;
    log::info("data", "{} ({}): {} windows, fewer than a micro-batch: evaluating {} at a time",
              o.dir, role, windows, o.sampler.micro_batch);
  }
  order_ = std::make_unique<SampleOrder>(o.sampler, std::move(bucket));
  int64_t global_batch = o.sampler.micro_batch * o.world_size;
  if (order_->epoch_length() < global_batch)
    throw DataError(o.dir + " (" + role + "): " + std::to_string(windows) + " windows of " +
                    std::to_string(T + 1) + " tokens give an epoch of " +
                    std::to_string(order_->epoch_length()) + " samples, fewer than one global " +
                    "micro-batch of " + std::to_string(global_batch) +
                    "; HINT: prepare more data, or lower model.seq_len / data.micro_batch_size");
  log::info("data",
            "{} ({}): {} tokens, {} documents, {} windows of {}+1 tokens, epoch {} "
            "samples, sampler {}",
            o.dir, role, set_->num_tokens(), docs.size(), windows, T, order_->epoch_length(),
            config::name_of(o.sampler.kind));
}

ShardLoader::~ShardLoader() { stop(); }

void ShardLoader::start() {
  if (running_) return;
  stopping_ = false;
  plan_cursor_ = committed_;
  ready_.clear();
  last_arrival_ = Clock::now();
  running_ = true;
  for (int64_t i = 0; i < options_.loader.workers; ++i) workers_.emplace_back([this] { worker(); });
}

void ShardLoader::stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  produced_.notify_all();
  consumed_.notify_all();
  for (auto& t : workers_) t.join();
  workers_.clear();
  std::lock_guard<std::mutex> lock(mu_);
  running_ = false;
  ready_.clear();
}

double ShardLoader::drop_fraction(int64_t micro_batch) const {
  int64_t step = micro_batch / options_.grad_accum_steps;
  double f = 0.0;
  for (const auto& fault : options_.faults)
    if (fault.kind == config::FaultKind::kDropSamples && step >= fault.at_step)
      f = std::max(f, fault.factor);
  return std::clamp(f, 0.0, 0.99);  // 1.0 would never fill a batch
}

double ShardLoader::stall_seconds(int64_t micro_batch) const {
  if (micro_batch % options_.grad_accum_steps != 0) return 0.0;
  int64_t step = micro_batch / options_.grad_accum_steps;
  double s = 0.0;
  for (const auto& fault : options_.faults)
    if (fault.kind == config::FaultKind::kLoaderStall && step >= fault.at_step &&
        step < fault.at_step + std::max<int64_t>(fault.steps, 1))
      s += fault.seconds;
  return s;
}

std::vector<int64_t> ShardLoader::plan(Cursor& c) {
  const int64_t B = options_.sampler.micro_batch, W = options_.world_size;
  double drop = drop_fraction(c.micro_batches);
  std::vector<int64_t> windows;
  while (static_cast<int64_t>(windows.size()) < B) {
    int64_t position = (c.chunk * W + options_.rank) * B + c.offset;
    int64_t window = order_->at(position);
    ++c.taken;
    if (++c.offset == B) {
      ++c.chunk;
      c.offset = 0;
    }
    if (drop > 0 && unit_hash(options_.sampler.seed, position) < drop) continue;  // lost
    windows.push_back(window);
  }
  ++c.micro_batches;
  return windows;
}

void ShardLoader::worker() {
  const int64_t B = options_.sampler.micro_batch, T = options_.seq_len;
  try {
    while (true) {
      int64_t k;
      std::vector<int64_t> windows;
      Cursor end;
      {
        std::unique_lock<std::mutex> lock(mu_);
        consumed_.wait(lock, [&] {
          return stopping_ || plan_cursor_.micro_batches - committed_.micro_batches <
                                  options_.loader.queue_capacity;
        });
        if (stopping_) return;
        k = plan_cursor_.micro_batches;
        windows = plan(plan_cursor_);
        end = plan_cursor_;
      }
      if (double s = stall_seconds(k); s > 0) {
        log::warn("data", "fault loader_stall: the producer sleeps {} s before micro-batch {}", s,
                  k);
        std::unique_lock<std::mutex> lock(mu_);
        consumed_.wait_for(lock, std::chrono::duration<double>(s), [&] { return stopping_; });
        if (stopping_) return;
      }
      auto tokens = torch::empty({B, T + 1}, torch::kInt64);  // (B, T+1)
      auto ids = torch::empty({B}, torch::kInt64);            // (B)
      auto lengths = torch::empty({B}, torch::kInt64);        // (B)
      auto buckets = torch::empty({B}, torch::kInt64);        // (B)
      auto* tok = tokens.data_ptr<int64_t>();
      auto* id = ids.data_ptr<int64_t>();
      for (int64_t b = 0; b < B; ++b) {
        id[b] = windows[b];
        set_->read(windows[b] * T, T + 1, tok + b * (T + 1));
        const int64_t doc = set_->document_at(windows[b] * T);
        lengths.data_ptr<int64_t>()[b] = doc >= 0 ? set_->documents()[doc].length : 0;
        buckets.data_ptr<int64_t>()[b] = order_->bucket_of(windows[b]);
      }
      {
        std::lock_guard<std::mutex> lock(mu_);
        ready_[k] = Item{{tokens, ids, lengths, buckets}, end};
        last_arrival_ = Clock::now();
      }
      produced_.notify_all();
    }
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!error_) error_ = std::current_exception();
    }
    produced_.notify_all();
  }
}

int64_t ShardLoader::ready_run() const {
  int64_t n = 0;
  for (auto it = ready_.find(committed_.micro_batches);
       it != ready_.end() && it->first == committed_.micro_batches + n; ++it)
    ++n;
  return n;
}

Batch ShardLoader::next() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!running_) start();
  int64_t depth = ready_run();
  if (depth < options_.loader.low_watermark || depth == 0) {
    // Backpressure: wait until the queue is refilled to the high watermark. The stall timeout
    // counts from the last batch the producers delivered, so a slow but moving producer never
    // trips it; when it expires with a batch ready, that batch is served first.
    const int64_t target = options_.loader.high_watermark;
    const auto timeout = std::chrono::duration_cast<Clock::duration>(
        std::chrono::duration<double>(options_.loader.stall_timeout_s));
    auto t0 = Clock::now();
    while (!error_ && (depth = ready_run()) < target) {
      if (produced_.wait_until(lock, last_arrival_ + timeout) == std::cv_status::timeout &&
          ready_run() == depth && !error_) {
        if (depth > 0) break;
        double waited = std::chrono::duration<double>(Clock::now() - t0).count();
        double idle = std::chrono::duration<double>(Clock::now() - last_arrival_).count();
        stats_.wait_ms += waited * 1e3;
        ++stats_.waits;
        throw RunStopped(fmt::format(
            "[data] the loader delivered no batch for {:.1f} s (data.loader.stall_timeout_s = {}); "
            "the trainer waited {:.1f} s for micro-batch {} with the queue empty; HINT: check the "
            "data directory's disk, or raise data.loader.stall_timeout_s / data.loader.workers",
            idle, options_.loader.stall_timeout_s, waited, committed_.micro_batches));
      }
    }
    stats_.wait_ms += std::chrono::duration<double>(Clock::now() - t0).count() * 1e3;
    ++stats_.waits;
  }
  if (error_) std::rethrow_exception(error_);
  auto it = ready_.find(committed_.micro_batches);
  Item item = std::move(it->second);
  ready_.erase(it);
  committed_ = item.end;
  served_ = committed_.taken;
  stats_.queue_depth = ready_run();
  lock.unlock();
  consumed_.notify_all();
  return item.batch;
}

LoaderStats ShardLoader::take_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  LoaderStats s = stats_;
  s.queue_depth = ready_run();
  stats_ = LoaderStats{};
  return s;
}

nlohmann::json ShardLoader::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {{"kind", "shards"},
          {"split", options_.split},
          {"sampler", config::name_of(options_.sampler.kind)},
          {"seed", options_.sampler.seed},
          {"epoch_length", order_->epoch_length()},
          {"micro_batch", options_.sampler.micro_batch},
          {"world_size", options_.world_size},
          {"micro_batches", committed_.micro_batches},
          {"chunk", committed_.chunk},
          {"offset", committed_.offset},
          {"served", committed_.taken}};
}

void ShardLoader::load_state(const nlohmann::json& s) {
  auto fail = [](const std::string& what) {
    throw DataError("data position in the checkpoint: " + what +
                    "; HINT: resume with the data and data.* settings the run started with");
  };
  try {
    if (s.at("kind").get<std::string>() != "shards")
      fail("it was saved by a non-shard data source");
    if (s.at("sampler").get<std::string>() != config::name_of(options_.sampler.kind))
      fail("saved with sampler " + s.at("sampler").get<std::string>() + ", now " +
           std::string(config::name_of(options_.sampler.kind)));
    if (s.at("seed").get<uint64_t>() != options_.sampler.seed) fail("saved with another seed");
    if (s.at("epoch_length").get<int64_t>() != order_->epoch_length())
      fail("saved with an epoch of " + s.at("epoch_length").dump() +
           " samples, the data now gives " + std::to_string(order_->epoch_length()) +
           " (the dataset changed, or keel's sample order did: checkpoints from before "
           "2026-12-05 were written under an order that depended on the micro-batch size)");
    Cursor c;
    c.micro_batches = s.at("micro_batches").get<int64_t>();
    c.chunk = s.at("chunk").get<int64_t>();
    c.offset = s.at("offset").get<int64_t>();
    c.taken = s.at("served").get<int64_t>();
    int64_t old_b = s.at("micro_batch").get<int64_t>(), old_w = s.at("world_size").get<int64_t>();
    if (old_b != options_.sampler.micro_batch || old_w != options_.world_size) {
      // A new layout (another micro-batch size or world size) continues at the same global
      // position when it divides evenly; the per-rank counts become this layout's.
      const int64_t global = c.chunk * old_b * old_w;
      const int64_t per = options_.sampler.micro_batch * options_.world_size;
      const int64_t taken = c.taken * old_w, done = c.micro_batches * old_b * old_w;
      if (c.offset != 0 || global % per != 0 || taken % options_.world_size != 0 || done % per != 0)
        fail("saved with micro_batch " + std::to_string(old_b) + " x world " +
             std::to_string(old_w) + ", which does not map onto " +
             std::to_string(options_.sampler.micro_batch) + " x " +
             std::to_string(options_.world_size));
      c.chunk = global / per;
      c.taken = taken / options_.world_size;
      c.micro_batches = done / per;
    }
    stop();
    std::lock_guard<std::mutex> lock(mu_);
    committed_ = c;
    served_ = c.taken;
    error_ = nullptr;
  } catch (const nlohmann::json::exception& e) {
    fail(std::string("malformed (") + e.what() + ")");
  }
}

std::string ShardLoader::decode(const torch::Tensor& tokens) const {
  auto t = tokens.to(torch::kCPU).to(torch::kInt64).contiguous();
  return tokenizer_->decode(t.data_ptr<int64_t>(), static_cast<size_t>(t.numel()));
}

nlohmann::json ShardLoader::locate(int64_t id) const {
  const int64_t pos = id * options_.seq_len;  // window id -> its first stream token
  const auto [shard, offset] = set_->shard_at(pos);
  if (shard.empty()) return nlohmann::json::object();
  const int64_t doc = set_->document_at(pos);
  nlohmann::json out = {{"shard", set_->dir() + "/" + shard}, {"offset", offset}};
  if (doc < 0) return out;
  out["doc_id"] = set_->documents()[doc].doc_id;
  if (provenance_)
    if (auto source = provenance_->where(set_->documents()[doc].doc_id); !source.empty())
      out["source"] = std::move(source);
  return out;
}

std::unique_ptr<BatchSource> make_shard_source(const config::Config& cfg, int rank, int world_size,
                                               bool validation) {
  LoaderOptions o;
  o.source = cfg.data.source;
  o.dir = cfg.data.path;
  o.split = "train";
  if (o.source != config::DataSource::kShards) {
    const bool own_val = cfg.data.val_path.empty();
    if (validation) o.dir = own_val ? cfg.data.path : cfg.data.val_path;
    if (validation && own_val) o.split = "val";
    o.held_out = own_val ? kForeignHeldOutShare : 0.0;
  } else if (validation) {
    if (!cfg.data.val_path.empty()) {
      o.dir = cfg.data.val_path;
      o.split = read_meta(o.dir).splits.count("val") ? "val" : "train";
    } else {
      o.split = "val";
    }
  }
  if (o.dir.empty())
    throw ConfigError("data.path: empty; HINT: set it to a directory written by `keel prepare`");
  o.seq_len = cfg.model.seq_len;
  o.rank = rank;
  o.world_size = world_size;
  o.grad_accum_steps = cfg.data.grad_accum_steps;
  o.model_vocab_size = cfg.model.vocab_size;
  o.sampler.kind = validation ? config::Sampling::kSequential : cfg.data.sampling;
  o.validation = validation;
  o.sampler.seed = static_cast<uint64_t>(cfg.run.seed);
  o.sampler.micro_batch = cfg.data.micro_batch_size;
  o.sampler.buckets = cfg.data.buckets;
  o.sampler.min_clusters = cfg.data.min_clusters_per_batch;
  o.loader = cfg.data.loader;
  if (!validation)
    for (const auto& f : cfg.faults)
      if (f.rank < 0 || f.rank == rank) o.faults.push_back(f);
  return std::make_unique<ShardLoader>(std::move(o));
}

}  // namespace keel::data
