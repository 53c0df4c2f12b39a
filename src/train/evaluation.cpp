// The model measured without a gradient: the validation loss (eval.jsonl) and the guard's
// reference batch, the measure that tells a broken model from bad data when it alarms.
#include "common/log.h"
#include "train/trainer_state.h"

namespace keel::train {

double Trainer::State::probe_loss() {
  torch::NoGradGuard no_grad;
  model->eval();
  auto tokens = defence.probe_tokens.to(device);  // (P, T+1)
  torch::Tensor loss;
  {
    optim::AutocastScope autocast(device.type(), compute.precision);
    loss = model->loss(tokens.slice(1, 0, -1), tokens.slice(1, 1)).ce_loss;
  }
  model->train();
  std::vector<torch::Tensor> t{loss.reshape({1})};
  comm.all_reduce_mean_(t);
  return t[0].item<double>();
}

double Trainer::State::evaluate() {
  monitor::StageRange range("keel/eval");
  const auto eval_start = Clock::now();
  torch::NoGradGuard no_grad;
  model->eval();
  // The same validation samples every time, so successive evaluations are comparable.
  feed.val_data->load_state(feed.val_start);
  torch::Tensor total =
      torch::zeros({}, torch::TensorOptions().dtype(torch::kFloat32).device(device));
  const int64_t batches = std::max<int64_t>(cfg.eval.batches, 1);
  for (int64_t i = 0; i < batches; ++i) {
    auto tokens = feed.val_data->next().tokens.to(device);  // (B, T+1)
    optim::AutocastScope autocast(device.type(), compute.precision);
    total += model->loss(tokens.slice(1, 0, -1), tokens.slice(1, 1)).ce_loss;
  }
  std::vector<torch::Tensor> t{total / static_cast<double>(batches)};
  comm.all_reduce_mean_(t);
  record.last_val_loss = t[0].item<double>();
  counters.evaluated();
  model->train();

  monitor::JsonRecord rec;
  rec.add("step", counters.step).add("val_loss", record.last_val_loss);
  if (record.loss_floor) rec.add("floor", *record.loss_floor);
  record.files.write_eval(counters.step, rec);
  // Eval time is not training time: keep it out of the next tokens/s figure.
  record.step_record->exclude(Clock::now() - eval_start);
  record.progress->finish();
  if (record.loss_floor)
    log::info("eval", "step {}: val_loss {:.4f} (floor {:.4f}, gap {:.4f})", counters.step,
              record.last_val_loss, *record.loss_floor, record.last_val_loss - *record.loss_floor);
  else
    log::info("eval", "step {}: val_loss {:.4f}", counters.step, record.last_val_loss);
  return record.last_val_loss;
}

}  // namespace keel::train
