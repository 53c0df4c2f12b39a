// datatrove's MinHash scheme (data/datatrove_minhash.h) against values datatrove 0.6.0 itself gave
// (numpy 2.4, Python 3.11; bench/data/datatrove_minhash.py's venv):
//   from datatrove.utils.text import simplify_text
//   from datatrove.pipeline.dedup.minhash import MinhashDedupSignature, MinhashConfig
//   s = MinhashDedupSignature(dir, config=MinhashConfig())  # English: spaCy's words
//   s.parameters; sh = s.get_shingles(text); s.get_signature(sh)
// The whole corpus comparison (the documents each removes, 70,915 man pages) is the bench's; these
// keep the pieces from drifting.
#include "data/datatrove_minhash.h"

#include <gtest/gtest.h>

#include <vector>

namespace keel::data {
namespace {

TEST(DatatroveMinHash, ParametersAreNumpysLegacyRandomStateDraws) {
  // np.random.RandomState(1).randint(1, 2**61 - 1, dtype=np.uint64, size=112), then (0, ...).
  const DatatroveMinHasher h(5, 112);
  ASSERT_EQ(h.a().size(), 112u);
  EXPECT_EQ(h.a()[0], 775169054918279404ull);
  EXPECT_EQ(h.a()[1], 1758426461858698313ull);
  EXPECT_EQ(h.a()[2], 2109959069025162ull);
  EXPECT_EQ(h.a()[111], 223865076026037746ull);
  EXPECT_EQ(h.b()[0], 1062448801025099917ull);
  EXPECT_EQ(h.b()[1], 1324811268927594100ull);
  EXPECT_EQ(h.b()[2], 1217488311597731462ull);
  EXPECT_EQ(h.b()[111], 1097409548522419201ull);
}

TEST(DatatroveMinHash, SimplifiesAsSimplifyText) {
  // Final sigma only after a cased letter and before none.
  EXPECT_EQ(datatrove_simplify("ΣΑΣ ΟΔΟΣ Σ aΣ ΣA"), "σας οδος σ aς σa");
  // Lower case (İ's two-character lower case loses its dot with the marks), NFD without marks.
  EXPECT_EQ(datatrove_simplify("İstanbul Café naïve Ångström"), "istanbul cafe naive angstrom");
  // Digit runs in any script, with one decimal separator inside, are one 0.
  EXPECT_EQ(datatrove_simplify("Version 1.000,5 of ١٢٣٫٤ costs 12⎖3, x9y 3,4,5!"),
            "version 0 0 of 0 costs 0 x0y 0 0");
  // Python's whitespace (vertical tab, em space, ideographic space, no-break space), stripped.
  EXPECT_EQ(datatrove_simplify("  tab\there\x0bvt\u2003em\u3000ideo\u00a0nbsp  "),
            "tab here vt em ideo nbsp");
  EXPECT_EQ(datatrove_simplify("don't stop—“quoted” «ça» 【x】 ％ end"),
            "don t stop quoted ca x end");
  // A lone combining mark between spaces leaves two spaces, as in Python.
  EXPECT_EQ(datatrove_simplify("a \u0301 b"), "a  b");
  EXPECT_EQ(datatrove_simplify("Plain ASCII: 3.14, (x+y)/2 = 1,5"), "plain ascii 0 x y 0 0");
}

TEST(DatatroveMinHash, ShinglesAndSignatureAreDatatroves) {
  const DatatroveMinHasher h(5, 112);
  const char* text = "The quick brown fox jumps over the lazy dog, then 12 more foxes jump.";
  const std::vector<uint64_t> shingles = h.shingles(text);
  ASSERT_EQ(shingles.size(), 10u);
  EXPECT_EQ(shingles[0], 7797000677988824208ull);
  EXPECT_EQ(shingles[1], 4793414983259776074ull);
  const std::vector<uint64_t> sig = h.signature(text);
  ASSERT_EQ(sig.size(), 112u);
  EXPECT_EQ(sig[0], 85330943174081874ull);
  EXPECT_EQ(sig[1], 663359892825767826ull);
  EXPECT_EQ(sig[2], 302227827184868053ull);
  EXPECT_EQ(sig[111], 3963570588256049ull);
  // Fewer words than a shingle: no shingle, no signature (never a duplicate).
  EXPECT_TRUE(h.shingles("only four words here").empty());
  EXPECT_TRUE(h.signature("only four words here").empty());
}

// Two buckets of one value each. Bucket 0 pairs (d0, d1) and (d2, d3); bucket 1, sorted by value
// then document, pairs (d2, d4) and then (d1, d3), which joins d0's cluster of 2 to d2's of 3:
// union by size makes d2 the root, so d2 stays and the first document does not.
TEST(DatatroveClusters, UnionBySizeInBucketOrderPicksTheDocumentThatStays) {
  DatatroveClusters c(2, 1);
  const std::vector<std::vector<uint64_t>> sigs = {{5, 100}, {5, 3}, {7, 1}, {7, 3}, {9, 1}};
  for (size_t d = 0; d < sigs.size(); ++d) c.add(static_cast<int64_t>(10 + d), sigs[d]);
  c.add(15, std::vector<uint64_t>{42, 43});  // shares no bucket
  EXPECT_EQ(c.removed(), (std::vector<int64_t>{10, 11, 13, 14}));
  EXPECT_EQ(c.pairs(), 4);
}

TEST(DatatroveClusters, ABucketsValuesMustAllAgree) {
  DatatroveClusters c(1, 2);
  EXPECT_THROW(c.add(3, std::vector<uint64_t>{1}), std::invalid_argument);
  c.add(0, std::vector<uint64_t>{1, 2});
  c.add(1, std::vector<uint64_t>{1, 3});  // the first value alone is not the bucket
  c.add(2, std::vector<uint64_t>{1, 2});
  EXPECT_EQ(c.removed(), (std::vector<int64_t>{2}));
}

}  // namespace
}  // namespace keel::data
