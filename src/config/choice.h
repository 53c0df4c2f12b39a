// Choice-valued config keys: every key that takes one of a fixed set of words is an enum with one
// name table, Choices<E>::kNames (indexed by the enumerator's value). Reading, writing, validation
// messages and logs all use that table; code compares enumerators, never text.
#pragma once

#include <array>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace keel::config {

template <class E>
struct Choices;

template <class E>
concept Choice = requires {
  Choices<E>::kNames;
};

template <Choice E>
constexpr std::string_view name_of(E e) {
  return Choices<E>::kNames[static_cast<size_t>(e)];
}
template <Choice E>
std::optional<E> parse_choice(std::string_view text) {
  for (size_t i = 0; i < Choices<E>::kNames.size(); ++i)
    if (Choices<E>::kNames[i] == text) return static_cast<E>(i);
  return std::nullopt;
}
// "auto|cpu|cuda": the valid words, for messages.
template <Choice E>
std::string choice_list() {
  std::string out;
  for (auto name : Choices<E>::kNames) out += (out.empty() ? "" : "|") + std::string(name);
  return out;
}

// Declares Enum's names; schema.h undefines it after its enums.
#define KEEL_CHOICE(Enum, ...)                                                     \
  template <>                                                                      \
  struct Choices<Enum> {                                                           \
    static constexpr auto kNames = std::to_array<std::string_view>({__VA_ARGS__}); \
  }

}  // namespace keel::config
