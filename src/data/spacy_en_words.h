// The words of datatrove-simplified text as datatrove's MinHash stage splits them for English:
// spaCy's English tokenizer (spacy.blank("en"); spaCy 3.8.18's rules, generated into
// third_party/spacy/spacy_en_rules.inc by scripts/gen_spacy_en_rules.py). Its algorithm
// (spacy/tokenizer.pyx: _split_affixes, _attach_tokens) over each space-separated span: a special
// case (tokenizer exception: "dont" is "do" "nt", "cannot" "can" "not") as its pieces; else
// prefixes and suffixes peeled off one at a time (a special case met on the way stops it), then
// the rest split at its infixes. On simplified text (lower case, no ASCII punctuation, digits 0)
// what splits is mostly the exceptions and a unit after a number ("0m", "0gb").
// Left out, as they cannot apply to simplified text: the URL matcher (each of its alternatives
// needs a '.'). A span that is not valid UTF-8 (text that was not) is one word; a text of 4 GiB or
// more is split on spaces alone.
#pragma once

#include <string_view>
#include <vector>

namespace keel::data {

// Appends the words of `simplified` (views into it) to `out`. Thread-safe; the spans split are
// cached for all threads, as spaCy caches them.
void spacy_en_words(std::string_view simplified, std::vector<std::string_view>& out);

}  // namespace keel::data
