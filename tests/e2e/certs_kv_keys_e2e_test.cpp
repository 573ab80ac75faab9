// `troupe certs` gives every member it issues the KV data plane's CURVE keys beside its
// certificate: the files load, each member accepts every member, and the secret is 0600.

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <algorithm>
#include <string>

#include "kvtransfer/kv_channel.hpp"
#include "tests/e2e/cluster_fixture.hpp"
#include "tests/scratch_dir.hpp"

namespace troupe::test::cluster {
namespace {

using troupe::testing::scratch_dir;

TEST(certs_kv_keys_e2e, every_issued_member_gets_kv_channel_keys_that_accept_the_others) {
  scratch_dir dir;
  const fs::path certs = dir.path() / "certs";
  make_credentials(certs, {"prefill", "decode"});
  const kv_channel_keys prefill = load_kv_channel_keys(certs, "prefill");
  const kv_channel_keys decode = load_kv_channel_keys(certs, "decode");
  EXPECT_NE(prefill.public_key, decode.public_key);
  for (const kv_channel_keys* keys : {&prefill, &decode}) {
    EXPECT_EQ(keys->allowed_public_keys.size(), 2u);
    for (const std::string& member : {prefill.public_key, decode.public_key}) {
      EXPECT_NE(std::find(keys->allowed_public_keys.begin(), keys->allowed_public_keys.end(), member),
                keys->allowed_public_keys.end());
    }
  }
  struct stat st {};
  ASSERT_EQ(::stat((certs / "decode.kv.key").c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0777, 0600u);
  // A member issued later is accepted by the earlier ones once its .kv.pub is beside theirs.
  make_credentials(certs, {"decode2"});
  EXPECT_EQ(load_kv_channel_keys(certs, "prefill").allowed_public_keys.size(), 3u);
}

}  // namespace
}  // namespace troupe::test::cluster
