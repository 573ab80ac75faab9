// [[tenants]]: a tenant's defaults fill what its requests leave unset, and a tenant's key names
// the tenant whatever the request claims.

#include <gtest/gtest.h>

#include "doors/tenant_table.hpp"

namespace troupe {
namespace {

tenant_table two_tenants() { return tenant_table({{"chat", "key-chat", 0, 200, 50}, {"batch", "", 3, 0, 0}}); }

TEST(tenant_table, a_tenants_defaults_fill_only_what_the_request_left_unset) {
  const tenant_table tenants = two_tenants();
  int priority = 0;
  service_targets targets{"chat", 0, 0};
  tenants.apply_defaults(priority, targets);
  EXPECT_EQ(targets.ttft_ms, 200);
  EXPECT_EQ(targets.tpot_ms, 50);
  targets = {"chat", 80, 0};
  tenants.apply_defaults(priority, targets);
  EXPECT_EQ(targets.ttft_ms, 80);  // the request's own
  EXPECT_EQ(targets.tpot_ms, 50);
  priority = 0;
  targets = {"batch", 0, 0};
  tenants.apply_defaults(priority, targets);
  EXPECT_EQ(priority, 3);
  priority = 1;
  tenants.apply_defaults(priority, targets);
  EXPECT_EQ(priority, 1);
  // Unknown and anonymous tenants keep what they sent.
  priority = 0;
  targets = {"someone", 0, 0};
  tenants.apply_defaults(priority, targets);
  EXPECT_EQ(targets.ttft_ms, 0);
  targets = {"", 0, 0};
  tenants.apply_defaults(priority, targets);
  EXPECT_EQ(priority, 0);
}

TEST(tenant_table, a_key_names_its_tenant_and_nothing_else_does) {
  const tenant_table tenants = two_tenants();
  EXPECT_TRUE(tenants.has_keys());
  EXPECT_EQ(tenants.tenant_of_key("key-chat"), "chat");
  EXPECT_EQ(tenants.tenant_of_key("key-cha"), std::nullopt);
  EXPECT_EQ(tenants.tenant_of_key("key-chatX"), std::nullopt);
  EXPECT_EQ(tenants.tenant_of_key(""), std::nullopt);  // batch has no key: the empty one is not it
  EXPECT_FALSE(tenant_table({{"batch", "", 3, 0, 0}}).has_keys());
}

TEST(tenant_table, impossible_tables_are_refused_by_name) {
  auto refused = [](std::vector<tenant_settings> tenants, const std::string& phrase) {
    try {
      tenant_table t(std::move(tenants));
      ADD_FAILURE() << "accepted; expected: " << phrase;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(phrase), std::string::npos) << e.what();
    }
  };
  refused({{"", "", 0, 0, 0}}, "without a name");
  refused({{"a", "", 0, 0, 0}, {"a", "", 0, 0, 0}}, "tenant 'a' is listed twice");
  refused({{"a", "k", 0, 0, 0}, {"b", "k", 0, 0, 0}}, "tenant 'b': its api_key is another tenant's");
  refused({{"a", "k\n", 0, 0, 0}}, "control character");
  refused({{"a", "", 0, -1, 0}}, "tenant 'a': ttft_ms and tpot_ms");
}

}  // namespace
}  // namespace troupe
