// Weights in parts (ZeRO-3's model.rank{r}.safetensors): any range of a parameter is read from
// the whole tensor or from pieces cut at other places, and the parts of every rank put together
// give the whole tensors back; a missing piece is an error naming the parameter.
#include "checkpoint/weight_parts.h"

#include <gtest/gtest.h>

#include "common/error.h"

namespace keel::checkpoint {
namespace {

using torch::Tensor;

// `w` (2-D) cut into pieces at `cuts`, with its shape, as ranks write them.
TensorMap parts_of(const std::string& name, const Tensor& w, const std::vector<int64_t>& cuts) {
  TensorMap out;
  const Tensor flat = w.reshape({-1});
  for (size_t i = 0; i + 1 < cuts.size(); ++i)
    out[piece_key(name, cuts[i])] = flat.narrow(0, cuts[i], cuts[i + 1] - cuts[i]).clone();
  out[shape_key(name)] = torch::tensor(w.sizes().vec(), torch::kInt64);
  return out;
}

TEST(WeightParts, AnyRangeComesFromTheWholeTensorOrFromPieces) {
  const Tensor w = torch::arange(30, torch::kFloat).view({5, 6});
  const TensorMap whole = {{"a.weight", w}};
  const TensorMap parts = parts_of("a.weight", w, {0, 7, 8, 20, 30});
  EXPECT_FALSE(is_weight_parts(whole));
  EXPECT_TRUE(is_weight_parts(parts));
  EXPECT_TRUE(is_shape_key(shape_key("a.weight")));
  EXPECT_FALSE(is_shape_key(piece_key("a.weight", 0)));
  EXPECT_FALSE(is_shape_key("a.weight"));
  for (const auto& source : {whole, parts}) {
    Tensor dst = torch::zeros({11});
    copy_elements(source, "a.weight", 5, dst);
    EXPECT_TRUE(torch::equal(dst, torch::arange(5, 16, torch::kFloat)));
  }
  EXPECT_TRUE(covers(parts, "a.weight", 5, 11));
  EXPECT_TRUE(covers(whole, "a.weight", 0, 30));
  EXPECT_FALSE(covers(whole, "a.weight", 20, 11));
  TensorMap holed = parts;
  holed.erase(piece_key("a.weight", 7));
  EXPECT_TRUE(covers(holed, "a.weight", 0, 7));
  EXPECT_FALSE(covers(holed, "a.weight", 5, 11));
  EXPECT_FALSE(covers(parts, "b.weight", 0, 1));
  const TensorMap back = whole_weights(parts);
  ASSERT_EQ(back.size(), 1u);
  EXPECT_TRUE(torch::equal(back.at("a.weight"), w));
}

TEST(WeightParts, AMissingPieceNamesTheParameter) {
  const Tensor w = torch::ones({4, 4});
  TensorMap parts = parts_of("b.weight", w, {0, 6, 16});
  parts.erase(piece_key("b.weight", 6));
  Tensor dst = torch::zeros({16});
  try {
    copy_elements(parts, "b.weight", 0, dst);
    FAIL() << "no error";
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("b.weight"), std::string::npos) << e.what();
  }
  EXPECT_THROW(whole_weights(parts), CheckpointError);
}

TEST(WeightParts, TheModelFilesAreTheWholeFileOrEveryRanksPart) {
  EXPECT_EQ(model_files({"MANIFEST.json", "model.safetensors"}),
            std::vector<std::string>{"model.safetensors"});
  EXPECT_EQ(model_files({"model.rank1.safetensors", "model.rank0.safetensors", "x"}),
            (std::vector<std::string>{"model.rank0.safetensors", "model.rank1.safetensors"}));
  EXPECT_TRUE(model_files({"optimizer.rank0.safetensors"}).empty());
}

}  // namespace
}  // namespace keel::checkpoint
