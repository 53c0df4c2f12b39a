#include "cli/trained_model.h"

#include <fstream>

#include "checkpoint/checkpointer.h"
#include "checkpoint/weight_reader.h"
#include "common/error.h"
#include "common/paths.h"
#include "config/load.h"

namespace keel::cli {

namespace fs = std::filesystem;

fs::path find_checkpoint_dir(const fs::path& arg) {
  std::error_code ec;
  if (!fs::is_directory(arg, ec))
    throw CheckpointError(arg.string() + ": no such directory" + relative_note(arg));
  if (fs::exists(arg / "MANIFEST.json", ec)) return arg;
  const fs::path checkpoints =
      fs::is_directory(arg / "checkpoints", ec) ? arg / "checkpoints" : arg;
  auto found = checkpoint::resolve_checkpoint(checkpoints, checkpoint::Pointer::kLatest);
  if (!found)
    throw CheckpointError(checkpoints.string() +
                          ": no checkpoint here verifies (or none exists); HINT: pass a step_N "
                          "directory, a checkpoints directory or a run directory");
  return *found;
}

TrainedModel load_trained_model(const fs::path& arg) {
  const fs::path dir = find_checkpoint_dir(arg);
  const checkpoint::Manifest manifest = checkpoint::read_manifest(dir);
  const std::string yaml = checkpoint::load_text(dir, manifest, "config.yaml");
  auto loaded = config::load_config_from_string(yaml, (dir / "config.yaml").string());
  TrainedModel t;
  t.checkpoint = dir;
  t.step = manifest.step;
  t.config = loaded.config;
  // The weights one tensor at a time (model.safetensors, or a ZeRO-3 checkpoint's parts), each
  // file verified first: the model is the one copy in memory.
  const checkpoint::WeightReader weights(dir);
  t.model = model::Transformer(t.config.model, model::TransformerImpl::Parameters::kDeferred);
  {
    torch::NoGradGuard no_grad;
    for (auto& item : t.model->named_parameters()) {
      auto it = weights.shapes().find(item.key());
      if (it == weights.shapes().end())
        throw CheckpointError(weights.source() + ": no weights for " + item.key());
      if (c10::IntArrayRef(it->second) != item.value().sizes())
        throw CheckpointError(dir.string() + ": weight " + item.key() +
                              " has another shape than model section of its config.yaml says");
      item.value().set_data(weights.read(item.key()));
    }
  }
  t.model->eval();
  if (t.config.data.source == config::DataSource::kShards) {
    const fs::path meta = fs::path(t.config.data.path) / "meta.json";
    std::ifstream in(meta);
    if (!in)
      throw DataError(meta.string() + ": the prepared data this model was trained on (data.path " +
                      "in the checkpoint's config.yaml) is not there; its tokenizer is needed to " +
                      "turn text into ids\nHINT: restore the dataset directory at that path");
    const auto j = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.contains("tokenizer"))
      throw DataError(meta.string() + ": not a keel dataset's meta.json (no tokenizer)");
    t.tokenizer = data::tokenizer_from_meta(j["tokenizer"], t.config.data.path);
  }
  return t;
}

}  // namespace keel::cli
