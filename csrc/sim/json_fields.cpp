#include "json_fields.h"

#include <cmath>
#include <sstream>

namespace zion::sim {

std::string describe_json_value(const nlohmann::json& value) {
  std::string text = value.dump();
  if (text.size() > 60) text = text.substr(0, 57) + "...";
  return text + " (" + value.type_name() + ")";
}

JsonFields::JsonFields(const nlohmann::json& object, std::string path, std::string origin)
    : object_(object), path_(std::move(path)), origin_(std::move(origin)) {
  if (!object_.is_object()) {
    throw ConfigError("platform " + origin_ + ": field '" + path_ + "' must be an object, got " +
                      describe_json_value(object_));
  }
}

std::string JsonFields::where(const std::string& key) const {
  return path_.empty() ? key : path_ + "." + key;
}

void JsonFields::fail(const std::string& key, const std::string& what) const {
  throw ConfigError("platform " + origin_ + ": field '" + where(key) + "' " + what);
}

const nlohmann::json& JsonFields::get(const std::string& key) {
  read_.insert(key);
  auto it = object_.find(key);
  if (it == object_.end()) fail(key, "is missing");
  return *it;
}

JsonFields JsonFields::object(const std::string& key) {
  return JsonFields(get(key), where(key), origin_);
}

const nlohmann::json& JsonFields::array(const std::string& key) {
  const auto& value = get(key);
  if (!value.is_array()) fail(key, "must be a list, got " + describe_json_value(value));
  return value;
}

namespace {
// Rates and sizes are later scaled (GB/s -> bytes/s) and divided into; a
// value past these would overflow or underflow there (1e-300 FLOP/s made
// modeled times infinite). Latencies are in nanoseconds: 1e12 is 1000 s.
constexpr double kLargestPositive = 1e18;
constexpr double kSmallestPositive = 1e-6;
constexpr double kLargestNanoseconds = 1e12;
}  // namespace

double JsonFields::number(const std::string& key) {
  const auto& value = get(key);
  if (!value.is_number()) fail(key, "must be a number, got " + describe_json_value(value));
  double x = value.get<double>();
  if (!std::isfinite(x)) fail(key, "must be finite");
  return x;
}

double JsonFields::positive(const std::string& key) {
  double x = number(key);
  if (!(x > 0)) fail(key, "must be > 0, got " + get(key).dump());
  if (x < kSmallestPositive || x > kLargestPositive) fail(key, "must be from 1e-6 to 1e18, got " + get(key).dump());
  return x;
}

double JsonFields::non_negative(const std::string& key) {
  double x = number(key);
  if (x < 0) fail(key, "must be >= 0, got " + get(key).dump());
  if (x > kLargestNanoseconds) fail(key, "must be at most 1e12 (ns: 1000 s), got " + get(key).dump());
  return x;
}

double JsonFields::fraction(const std::string& key) {
  double x = number(key);
  if (!(x > 0 && x <= 1)) fail(key, "must be in (0, 1], got " + get(key).dump());
  return x;
}

int JsonFields::integer(const std::string& key, int min_value, int max_value) {
  const auto& value = get(key);
  if (!value.is_number_integer()) fail(key, "must be an integer, got " + describe_json_value(value));
  int64_t x = value.get<int64_t>();
  if (x < min_value || x > max_value) {
    fail(key, "must be an integer from " + std::to_string(min_value) + " to " + std::to_string(max_value) + ", got " +
                  value.dump());
  }
  return static_cast<int>(x);
}

int64_t JsonFields::bytes(const std::string& key) {
  const auto& value = get(key);
  if (!value.is_number_integer() || value.get<int64_t>() <= 0) {
    fail(key, "must be a positive integer number of bytes, got " + describe_json_value(value));
  }
  return value.get<int64_t>();
}

bool JsonFields::boolean(const std::string& key) {
  const auto& value = get(key);
  if (!value.is_boolean()) fail(key, "must be true or false, got " + describe_json_value(value));
  return value.get<bool>();
}

std::string JsonFields::text(const std::string& key) {
  const auto& value = get(key);
  if (!value.is_string()) fail(key, "must be a string, got " + describe_json_value(value));
  return value.get<std::string>();
}

std::string JsonFields::choice(const std::string& key, const std::vector<std::string>& allowed) {
  const auto& value = get(key);
  std::ostringstream names;
  for (size_t i = 0; i < allowed.size(); ++i) names << (i ? ", " : "") << allowed[i];
  if (value.is_string()) {
    for (const auto& a : allowed) {
      if (value.get<std::string>() == a) return a;
    }
  }
  fail(key, "is " + describe_json_value(value) + "; allowed: " + names.str());
}

void JsonFields::skip(const std::string& key) { read_.insert(key); }

std::vector<std::string> JsonFields::keys() const {
  std::vector<std::string> out;
  for (auto it = object_.begin(); it != object_.end(); ++it) out.push_back(it.key());
  return out;
}

void JsonFields::finish() const {
  for (auto it = object_.begin(); it != object_.end(); ++it) {
    if (read_.count(it.key())) continue;
    std::ostringstream allowed;
    bool first = true;
    for (const auto& k : read_) {
      allowed << (first ? "" : ", ") << k;
      first = false;
    }
    throw ConfigError("platform " + origin_ + ": unknown field '" + where(it.key()) +
                      "'; allowed here: " + allowed.str());
  }
}

}  // namespace zion::sim
