// Request ids across controllers (issue 10): two controllers sending to the same stages must
// never hand out the same id, and every id stays a positive int64 that names its door.

#include <gtest/gtest.h>

#include <set>
#include <stdexcept>
#include <string>

#include "doors/request_admission.hpp"

namespace troupe {
namespace {

TEST(request_admission, ids_of_two_controllers_never_collide_and_keep_their_door) {
  // 0 and the largest id: the bits either side of the controller's must hold.
  request_admission first(1000, 0);
  request_admission second(1000, request_admission::max_controller_id);
  std::set<int64_t> seen;
  for (int i = 0; i < 50; ++i) {
    for (auto* admission : {&first, &second}) {
      for (auto door : {client_door::zmq, client_door::http}) {
        auto id = admission->admit(door, 3);
        ASSERT_TRUE(id);
        for (int k = 0; k < 3; ++k) {
          const int64_t nth = request_admission::nth_id(*id, k);
          EXPECT_GT(nth, 0);
          EXPECT_EQ(request_admission::door_of(nth), door);
          EXPECT_EQ(request_admission::controller_of(nth), admission->controller_id());
          EXPECT_TRUE(seen.insert(nth).second) << "id " << nth << " handed out twice";
        }
      }
    }
  }
  EXPECT_EQ(seen.size(), 600u);
}

TEST(request_admission, a_controller_id_too_wide_for_its_bits_is_refused_by_name) {
  try {
    request_admission admission(10, request_admission::max_controller_id + 1);
    FAIL() << "a controller id of " << request_admission::max_controller_id + 1 << " was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("controller id 32768"), std::string::npos) << e.what();
  }
}

TEST(request_admission, the_default_controller_id_is_drawn_within_its_bits) {
  std::set<uint32_t> drawn;
  for (int i = 0; i < 16; ++i) {
    request_admission admission(10);
    EXPECT_LE(admission.controller_id(), request_admission::max_controller_id);
    auto id = admission.admit(client_door::zmq);
    ASSERT_TRUE(id);
    EXPECT_EQ(request_admission::controller_of(*id), admission.controller_id());
    drawn.insert(admission.controller_id());
  }
  // Random, not one constant: 16 draws of 15 bits all equal has a chance of 2^-225.
  EXPECT_GT(drawn.size(), 1u);
}

TEST(request_admission, grow_raises_the_bound_for_an_added_instance) {
  request_admission admission(2);
  ASSERT_TRUE(admission.admit(client_door::zmq, 2));
  EXPECT_FALSE(admission.admit(client_door::http));
  admission.grow(3);
  EXPECT_EQ(admission.max_in_flight(), 5);
  EXPECT_TRUE(admission.admit(client_door::http, 3));
  EXPECT_FALSE(admission.admit(client_door::zmq));
}

}  // namespace
}  // namespace troupe
