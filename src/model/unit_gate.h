// Where a model hands control around each unit of its parameters: ZeRO-3 (distributed/
// sharded_parameters.h) gathers a unit's weights from every rank before the unit computes and
// frees them after, then gathers them again before the unit's backward pass. The model only says
// which parameters make up each unit and when each one runs; without a gate nothing happens.
#pragma once

#include <torch/torch.h>

#include <string>
#include <vector>

namespace keel::model {

// The model's parameters cut into units, in the order the forward pass uses them: the embedding,
// each transformer block, then the final norm and the head. With tied embeddings the head's
// weight is the embedding's, so the final norm joins the embedding's unit, which is then the head
// unit too.
struct ParameterUnits {
  std::vector<std::vector<std::string>> names;  // per unit, parameter names
  int64_t head = 0;                             // the unit the loss is computed with
  // Per unit: whether its backward pass reads its weights (an embedding's needs the token ids
  // only, so ZeRO-3 need not gather it again).
  std::vector<bool> weights_in_backward;
};

class UnitGate {
 public:
  virtual ~UnitGate() = default;
  // Before unit `unit` computes (in a forward pass, with or without gradient).
  virtual void enter(int64_t unit) = 0;
  // After it, with what it produced: the gate may hook that tensor's gradient (the moment the
  // unit's backward pass is about to run). Returns the tensor to go on with.
  virtual torch::Tensor leave(int64_t unit, const torch::Tensor& output) = 0;
};

}  // namespace keel::model
