#pragma once
// Name tables: the values of an enum with the names users write for them in
// platform files, Python and on the command line. Each enum has one table, in
// the header that declares the enum; its name, its parser, the loader's
// validation and the lists bound to Python are all read from that table, so
// a name is spelled once.

#include <array>
#include <cstddef>
#include <stdexcept>
#include <string>
#include <vector>

namespace zion::sim {

template <typename E>
struct Named {
  E value;
  const char* name;
};

template <typename E, std::size_t N>
const char* name_of(const std::array<Named<E>, N>& table, E value) {
  for (const auto& entry : table) {
    if (entry.value == value) return entry.name;
  }
  return "?";
}

// Every name of the table, in its order (the order error messages list them).
template <typename E, std::size_t N>
std::vector<std::string> names_of(const std::array<Named<E>, N>& table) {
  std::vector<std::string> out;
  out.reserve(N);
  for (const auto& entry : table) out.emplace_back(entry.name);
  return out;
}

// "a, b, c": how errors list the allowed names.
inline std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& name : names) out += (out.empty() ? "" : ", ") + name;
  return out;
}

// The value named `name`; otherwise throws std::invalid_argument
// "unknown <what> '<name>'; allowed: <every name>".
template <typename E, std::size_t N>
E parse_name(const std::array<Named<E>, N>& table, const std::string& name, const char* what) {
  for (const auto& entry : table) {
    if (name == entry.name) return entry.value;
  }
  throw std::invalid_argument("unknown " + std::string(what) + " '" + name + "'; allowed: " + join_names(names_of(table)));
}

}  // namespace zion::sim
