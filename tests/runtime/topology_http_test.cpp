// The [http] section of a topology: the shipped file turns the API on; bad values are named.

#include <gtest/gtest.h>

#include "runtime/topology.hpp"

namespace troupe {
namespace {

TEST(topology_http, the_shipped_file_serves_http_on_8000) {
  auto t = load_topology(TROUPE_SOURCE_DIR "/config/colocated.toml");
  EXPECT_TRUE(t.http_enabled);
  EXPECT_EQ(t.http_host, "127.0.0.1");
  EXPECT_EQ(t.http_port, 8000);
  EXPECT_EQ(t.http_max_body_bytes, 4u << 20);
  EXPECT_EQ(t.served_model_name, "");
}

TEST(topology_http, off_unless_asked_for) {
  // Without a file nothing binds a fixed port (tests start many servers side by side).
  EXPECT_FALSE(topology{}.http_enabled);
  EXPECT_FALSE(parse_topology("[model]\npath = \"m\"\n").http_enabled);
}

TEST(topology_http, reads_every_key) {
  auto t = parse_topology(R"(
[http]
enabled = true
host = "0.0.0.0"
port = 9001
max_body_bytes = 65536
max_connections = 64
served_model_name = "tiny"
)");
  EXPECT_TRUE(t.http_enabled);
  EXPECT_EQ(t.http_host, "0.0.0.0");
  EXPECT_EQ(t.http_port, 9001);
  EXPECT_EQ(t.http_max_body_bytes, 65536u);
  EXPECT_EQ(t.http_max_connections, 64);
  EXPECT_EQ(t.served_model_name, "tiny");
}

void expect_error(const std::string& text, const std::string& needle) {
  try {
    parse_topology(text, "t.toml");
    FAIL() << "no error for: " << text;
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(topology_http, errors_name_the_setting) {
  expect_error("[http]\nenabled = \"yes\"\n", "enabled must be true or false");
  expect_error("[http]\nenabled = true\nport = 70000\n", "port must be in 0..65535");
  expect_error("[http]\nenabled = true\nmax_body_bytes = 10\n", "max_body_bytes must be at least 1024");
  expect_error("[http]\nenabled = true\nmax_connections = 2\n", "max_connections must be at least 16");
  expect_error("[http]\nprot = 1\n", "unknown key 'prot' in [http]");
}

}  // namespace
}  // namespace troupe
