// A trained model read back from a checkpoint, for the commands that use one (sample, export):
// the checkpoint verified against its MANIFEST.json, the model built from the config stored with
// it, its weights loaded, and the tokenizer of the data it was trained on.
#pragma once

#include <filesystem>
#include <memory>
#include <string>

#include "config/schema.h"
#include "data/tokenizer.h"
#include "model/transformer.h"

namespace keel::cli {

struct TrainedModel {
  std::filesystem::path checkpoint;  // the step directory read
  int64_t step = 0;
  config::Config config;  // as stored in the checkpoint (config.yaml)
  model::Transformer model{nullptr};
  // The prepared data's tokenizer (meta.json of data.path); null for synthetic data, which has
  // token ids and no text.
  std::unique_ptr<data::Tokenizer> tokenizer;
};

// The step directory `arg` names: itself when it holds a MANIFEST.json, else the checkpoint LATEST
// names in it (or in its checkpoints/), falling back to the newest that verifies. CheckpointError
// when there is none.
std::filesystem::path find_checkpoint_dir(const std::filesystem::path& arg);

// `dir`: a step directory, a checkpoints directory or a run directory (then the checkpoint LATEST
// names, falling back to the newest that verifies). CheckpointError (exit 2) when nothing there
// verifies; DataError when the run's prepared data (for its tokenizer) is gone.
TrainedModel load_trained_model(const std::filesystem::path& dir);

}  // namespace keel::cli
