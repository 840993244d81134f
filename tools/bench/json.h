// One JSON object on one line, built key by key (asynctp-bench's --json output).
#pragma once

#include <cstdint>
#include <string>

namespace asynctp::bench {

class JsonLine {
 public:
  JsonLine& add(const std::string& key, const std::string& value);
  JsonLine& add(const std::string& key, const char* value) { return add(key, std::string(value)); }
  JsonLine& add(const std::string& key, double value);  // non-finite values become null
  JsonLine& add(const std::string& key, int64_t value);
  JsonLine& add(const std::string& key, int value) { return add(key, static_cast<int64_t>(value)); }
  JsonLine& add(const std::string& key, bool value);
  std::string str() const { return "{" + body_ + "}"; }

 private:
  void key(const std::string& k);
  std::string body_;
};

std::string json_escape(const std::string& s);

}  // namespace asynctp::bench
