#include "node/local_host.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include <string>

namespace troupe {
namespace {

TEST(local_host, loopback_names_and_addresses_are_this_machine) {
  EXPECT_TRUE(is_local_host("localhost"));
  EXPECT_TRUE(is_local_host("127.0.0.1"));
  EXPECT_TRUE(is_local_host("127.0.0.2"));
  EXPECT_TRUE(is_local_host("::1"));
  EXPECT_TRUE(is_local_host("[::1]"));
}

TEST(local_host, every_address_of_a_local_interface_is_this_machine) {
  ifaddrs* interfaces = nullptr;
  ASSERT_EQ(::getifaddrs(&interfaces), 0);
  int num_checked = 0;
  for (const ifaddrs* i = interfaces; i != nullptr; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr, text, sizeof text);
    EXPECT_TRUE(is_local_host(text)) << text;
    ++num_checked;
  }
  ::freeifaddrs(interfaces);
  EXPECT_GT(num_checked, 0);
}

TEST(local_host, other_addresses_and_names_are_not) {
  EXPECT_FALSE(is_local_host("192.0.2.1"));  // TEST-NET-1: documentation only, never assigned
  EXPECT_FALSE(is_local_host("2001:db8::1"));
  EXPECT_FALSE(is_local_host("gpu-box-7.example"));  // names are never resolved
  EXPECT_FALSE(is_local_host(""));
}

}  // namespace
}  // namespace troupe
