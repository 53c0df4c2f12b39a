// The step's micro-batches forward and backward, screened, eagerly or replayed from a CUDA graph
// (train/micro_graph.h); their gradients sum in .grad.
#include <limits>

#include "train/trainer_state.h"

namespace keel::train {

namespace {

// The micro-batch's samples kept for the guard: the screen's records, forensics and statistics.
void add_samples(StepSamples& samples, const data::Batch& batch, const MicroOutput& out,
                 const std::vector<int64_t>& fingerprints, bool screened) {
  samples.ids.push_back(batch.sample_ids);
  samples.losses.push_back(out.per_sample_loss);
  samples.tokens.push_back(batch.tokens);
  if (screened) samples.keep.push_back(out.keep);
  if (batch.doc_lengths.defined()) samples.doc_lengths.push_back(batch.doc_lengths);
  if (batch.buckets.defined()) samples.buckets.push_back(batch.buckets);
  samples.fingerprints.insert(samples.fingerprints.end(), fingerprints.begin(), fingerprints.end());
}

}  // namespace

// Runs the step's micro-batches (accumulation.steps()) forward and backward; their gradients sum in
// .grad. With a screen threshold, samples whose loss is above it (not NaN ones: those are the
// guard's) weigh 0, the rest 1/B each. Returns (2) on the device: the kept samples' summed
// cross-entropy and their count.
MicroBatches Trainer::State::forward_backward(bool keep_samples,
                                              std::optional<double> screen_threshold,
                                              std::optional<double> low_threshold) {
  const int64_t accum = feed.accumulation.steps();
  const double growth = launch.faults->gradient_growth(counters.iteration);
  model->train();
  const auto fp32 = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  torch::Tensor loss_sum = torch::zeros({}, fp32), kept = torch::zeros({}, fp32);
  StepSamples samples;
  double loader_wait_s = 0.0, comm_s = 0.0;
  std::vector<int64_t> sample_ids;                // logging.sample_ids: this step's data, in order
  const int64_t position = counters.micro_taken;  // of its first micro-batch in the data order
  for (int64_t micro = 0; micro < accum; ++micro) {
    std::optional<monitor::StageRange> range(std::in_place, "keel/data");
    const auto wait_start = Clock::now();
    data::Batch batch = next_batch();
    loader_wait_s += seconds_since(wait_start);
    if (cfg.logging.sample_ids) {
      const auto ids = batch.sample_ids.to(torch::kCPU, torch::kInt64).contiguous();
      sample_ids.insert(sample_ids.end(), ids.data_ptr<int64_t>(),
                        ids.data_ptr<int64_t>() + ids.numel());
    }
    const std::vector<int64_t> fingerprints =
        keep_samples ? Screen::fingerprints(batch.tokens) : std::vector<int64_t>{};
    range.reset();
    if (keep_samples) defence.replay.remember_rng(device, micro);  // a replay starts from it
    const MicroOutput out =
        run_micro(batch, micro, fingerprints, screen_threshold, low_threshold, growth);
    loss_sum += out.loss_sum;
    kept += out.kept;
    // The reduction a backward pass started ends here where it must (the last micro-step's
    // ends in measure(), after a fault changed the gradients, unless the plan ends each in its
    // own micro-step).
    const auto comm_start = Clock::now();
    parallel->after_backward(micro, accum);
    if (comm.is_process_group()) comm_s += seconds_since(comm_start);
    if (keep_samples) add_samples(samples, batch, out, fingerprints, screen_threshold.has_value());
  }
  if (cfg.logging.sample_ids) write_sample_ids(std::move(sample_ids), position);
  return {torch::stack({loss_sum, kept}), std::move(samples), loader_wait_s, comm_s};
}

// One micro-batch forward and backward: replayed from the CUDA graph where there is one (and no
// grad_growth or corrupt_grad fault scales the objective: a value the graph does not hold),
// eagerly otherwise.
MicroOutput Trainer::State::run_micro(const data::Batch& batch, int64_t micro,
                                      const std::vector<int64_t>& fingerprints,
                                      std::optional<double> screen_threshold,
                                      std::optional<double> low_threshold, double growth) {
  const auto accum = static_cast<double>(feed.accumulation.steps());
  const bool corrupt =
      launch.faults->gradient_corruption(counters.iteration, defence.replay.replaying()) != 1.0;
  if (compute.micro_graph && growth == 1.0 && !corrupt) {
    monitor::StageRange graph_range("keel/graph");
    auto out = compute.micro_graph->run(
        batch.tokens, screen_threshold.value_or(std::numeric_limits<double>::infinity()), accum,
        [this, micro](const auto& tokens, const auto& level, const auto& divisor) {
          return micro_step(tokens, level, divisor, {}, 1.0, micro);
        });
    if (out) return std::move(*out);
  }
  // After the capture the attention statistics are the graph's tensors, which each replay
  // rewrites: an eager pass must not put its own in their place.
  const bool graph_stats = compute.micro_graph && compute.micro_graph->captured();
  if (graph_stats) model->set_record_activation_stats(false);
  LowKeep low_keep;
  if (defence.screen.masks_low_side({screen_threshold, low_threshold}))
    low_keep = [&](const torch::Tensor& losses) {
      return defence.screen.low_side_keep(losses, batch, fingerprints, low_threshold);
    };
  const auto fp32 = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  MicroOutput out =
      micro_step(batch.tokens.to(device, /*non_blocking=*/true),
                 screen_threshold ? torch::full({}, *screen_threshold, fp32) : torch::Tensor(),
                 torch::full({}, accum, fp32), low_keep, growth, micro);
  if (graph_stats) model->set_record_activation_stats(true);
  return out;
}

// One micro-batch: tokens (B, T+1) on the device; `threshold` (() fp32 on the device, undefined:
// no screen) masks the samples above it, and `low_keep` (when set) multiplies the kept mask.
MicroOutput Trainer::State::micro_step(const torch::Tensor& tokens, const torch::Tensor& threshold,
                                       const torch::Tensor& divisor, const LowKeep& low_keep,
                                       double growth, int64_t micro) {
  model::LossOutput out;
  {
    monitor::StageRange range("keel/forward");
    optim::AutocastScope autocast(device.type(), compute.precision);
    out = model->loss(tokens.slice(1, 0, -1), tokens.slice(1, 1));
  }
  MicroOutput m;
  m.per_sample_loss = out.per_sample_loss;
  const auto samples = static_cast<double>(out.per_sample_loss.numel());
  m.loss_sum = out.ce_loss * samples;
  m.kept = torch::full({}, samples, out.ce_loss.options());
  // Each micro-batch contributes 1/accum of the step's mean loss, so the summed gradient equals
  // the gradient of one batch accum times larger.
  torch::Tensor objective = out.loss;
  if (threshold.defined()) {
    m.keep = Screen::keep_mask(out.per_sample_loss, threshold,
                               low_keep ? low_keep(out.per_sample_loss) : torch::Tensor());
    // The masked samples' share taken back out: x - 0 is x, so a step that masks nothing
    // computes exactly what an unscreened step does, bit for bit.
    const auto masked = 1.0 - m.keep;
    objective = objective - (out.per_sample_objective * masked).mean();
    m.loss_sum = m.loss_sum - (out.per_sample_loss * masked).sum();
    m.kept = m.kept - masked.sum();
  }
  torch::Tensor scaled = objective / divisor;
  if (scaler) scaled = scaled * scaler->scale();
  if (growth != 1.0) scaled = scaled * growth;  // measure() divides the gradients back
  // corrupt_grad: this rank's device computes its gradient wrong (nothing divides it back).
  if (const double wrong =
          launch.faults->gradient_corruption(counters.iteration, defence.replay.replaying());
      wrong != 1.0)
    scaled = scaled * wrong;
  parallel->arm(micro, feed.accumulation.steps(),
                launch.faults->touches_gradients(counters.iteration));
  monitor::StageRange range("keel/backward");
  scaled.backward();
  return m;
}

void Trainer::State::write_sample_ids(std::vector<int64_t> sample_ids, int64_t position) {
  if (comm.world_size() > 1) {  // every rank's part of the step, in rank order
    const auto all = comm.all_gather(torch::tensor(sample_ids, torch::kInt64).to(device))
                         .to(torch::kCPU)
                         .contiguous();
    sample_ids.assign(all.data_ptr<int64_t>(), all.data_ptr<int64_t>() + all.numel());
  }
  record.files.samples.write(monitor::JsonRecord()
                                 .add("step", counters.step + 1)
                                 .add("iteration", counters.iteration)
                                 .add("position", position)
                                 .add("ids", nlohmann::json(sample_ids)));
}

}  // namespace keel::train
