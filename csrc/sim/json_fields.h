#pragma once
// Typed, validating access to one JSON object of a platform file.
//
// Every read names the field by its dotted path, so an error says exactly
// which field was wrong and what is allowed. `finish()` rejects fields that
// were never read: the set of reads is the schema.

#include <nlohmann/json.hpp>

#include <set>
#include <string>
#include <vector>

#include "platform_loader.h"

namespace zion::sim {

class JsonFields {
 public:
  JsonFields(const nlohmann::json& object, std::string path, std::string origin);

  JsonFields object(const std::string& key);
  const nlohmann::json& array(const std::string& key);
  double positive(const std::string& key);     // a rate or size: from 1e-6 to 1e18
  double non_negative(const std::string& key);  // a latency in ns: from 0 to 1e12
  double fraction(const std::string& key);      // in (0, 1]
  // An integer from `min_value` to `max_value` (a bound the model can still run in reasonable time).
  int integer(const std::string& key, int min_value, int max_value = 1 << 30);
  int64_t bytes(const std::string& key);  // positive integer byte count
  bool boolean(const std::string& key);
  std::string text(const std::string& key);
  std::string choice(const std::string& key, const std::vector<std::string>& allowed);
  // Reads a key that the schema allows but that is not part of the model.
  void skip(const std::string& key);
  // Keys present in this object (for maps such as lane bandwidth by generation).
  std::vector<std::string> keys() const;

  // Throws for any field present in the file that no read asked for.
  void finish() const;

  std::string where(const std::string& key) const;
  const std::string& origin() const { return origin_; }
  [[noreturn]] void fail(const std::string& key, const std::string& what) const;

 private:
  const nlohmann::json& get(const std::string& key);
  double number(const std::string& key);

  const nlohmann::json& object_;
  std::string path_;
  std::string origin_;
  std::set<std::string> read_;
};

std::string describe_json_value(const nlohmann::json& value);

}  // namespace zion::sim
