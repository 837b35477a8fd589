// The subgroup state machine, exhaustively: every (phase, dirty) x event pair against a table
// written out here independently of the implementation, and, over every reachable state and
// every sequence of events, the properties the pipeline relies on.
#include <doctest/doctest.h>

#include <map>
#include <optional>
#include <queue>
#include <set>
#include <tuple>
#include <vector>

#include <strata/pipeline/subgroup_state.hpp>

// The folder's tests compile together: this file's names stay in its own namespace.
namespace state_machine_test {

namespace {

using P = strata::subgroup_phase;
using E = strata::subgroup_event;
using S = strata::subgroup_state;

constexpr S st(P p, bool d) { return S{p, d}; }

// Every legal move, and nothing else.
std::map<std::tuple<P, bool, E>, S> legal() {
  std::map<std::tuple<P, bool, E>, S> t;
  t[{P::on_tier, false, E::read}] = st(P::reading, false);
  t[{P::reading, false, E::read_done}] = st(P::resident, false);
  t[{P::reading, false, E::read_failed}] = st(P::on_tier, false);
  for (const bool d : {false, true}) {
    t[{P::resident, d, E::update}] = st(P::updating, d);
    t[{P::updating, d, E::update_done}] = st(P::resident, true);
    t[{P::updating, d, E::update_failed}] = st(P::resident, d);
    t[{P::resident, d, E::h2d}] = st(P::to_device, d);
    t[{P::to_device, d, E::h2d_done}] = st(P::on_device, d);
    t[{P::on_device, d, E::kernel_done}] = st(P::to_host, d);
    t[{P::to_host, d, E::d2h_done}] = st(P::resident, true);
    for (const P p : {P::to_device, P::on_device, P::to_host}) t[{p, d, E::device_failed}] = st(P::resident, d);
  }
  t[{P::resident, true, E::write}] = st(P::writing, true);
  t[{P::writing, true, E::write_done}] = st(P::resident, false);
  t[{P::writing, true, E::write_failed}] = st(P::resident, true);
  t[{P::resident, false, E::drop}] = st(P::on_tier, false);
  return t;
}

std::vector<S> all_states() {
  std::vector<S> v;
  for (std::size_t p = 0; p < strata::subgroup_phase_count; ++p)
    for (const bool d : {false, true}) v.push_back(st(static_cast<P>(p), d));
  return v;
}
std::vector<E> all_events() {
  std::vector<E> v;
  for (std::size_t e = 0; e < strata::subgroup_event_count; ++e) v.push_back(static_cast<E>(e));
  return v;
}

// States reachable from on_tier (clean).
std::set<std::pair<int, bool>> reachable() {
  std::set<std::pair<int, bool>> seen{{static_cast<int>(P::on_tier), false}};
  std::queue<S> q;
  q.push(st(P::on_tier, false));
  while (!q.empty()) {
    const S s = q.front();
    q.pop();
    for (const E e : all_events())
      if (const auto n = strata::transition(s, e))
        if (seen.insert({static_cast<int>(n->phase), n->dirty}).second) q.push(*n);
  }
  return seen;
}

}  // namespace

TEST_CASE("every (state, event) pair leads where the table says, and every pair not in it is refused") {
  const auto table = legal();
  std::size_t checked = 0;
  for (const S s : all_states())
    for (const E e : all_events()) {
      CAPTURE(strata::to_string(s.phase));
      CAPTURE(s.dirty);
      CAPTURE(strata::to_string(e));
      const auto got = strata::transition(s, e);
      const auto it = table.find({s.phase, s.dirty, e});
      if (it == table.end()) {
        CHECK_FALSE(got.has_value());
      } else {
        REQUIRE(got.has_value());
        CHECK(*got == it->second);
      }
      ++checked;
    }
  CHECK(checked == strata::subgroup_phase_count * 2 * strata::subgroup_event_count);
}

TEST_CASE("no sequence of events drops a dirty subgroup, and only a committed update makes one dirty") {
  for (const S s : all_states())
    for (const E e : all_events()) {
      const auto n = strata::transition(s, e);
      if (!n) continue;
      CAPTURE(strata::to_string(s.phase));
      CAPTURE(strata::to_string(e));
      if (s.dirty && n->phase == P::on_tier) FAIL("a dirty subgroup reached on_tier");
      if (!s.dirty && n->dirty) CHECK((e == E::update_done || e == E::d2h_done));
      if (s.dirty && !n->dirty) CHECK(e == E::write_done);  // only a successful write cleans
      // A failure never changes whether the host copy is newer than the tier.
      if (e == E::update_failed || e == E::device_failed || e == E::write_failed || e == E::read_failed)
        CHECK(n->dirty == s.dirty);
    }
}

TEST_CASE("from every reachable state the subgroup can get back to the tier, and each state has its exits") {
  const auto reach = reachable();
  CHECK(reach.size() == 13);  // on_tier and reading clean only; writing dirty only; the rest both ways
  for (const auto& [p, d] : reach) {
    // Search for a path back to on_tier.
    std::set<std::pair<int, bool>> seen{{p, d}};
    std::queue<S> q;
    q.push(st(static_cast<P>(p), d));
    bool home = p == static_cast<int>(P::on_tier);
    while (!q.empty() && !home) {
      const S s = q.front();
      q.pop();
      for (const E e : all_events())
        if (const auto n = strata::transition(s, e)) {
          if (n->phase == P::on_tier) home = true;
          if (seen.insert({static_cast<int>(n->phase), n->dirty}).second) q.push(*n);
        }
    }
    CAPTURE(strata::to_string(static_cast<P>(p)));
    CAPTURE(d);
    CHECK(home);
  }
  // In-flight phases are exactly those that hold a slot but are not idle.
  for (const S s : all_states()) {
    CHECK(strata::holds_host_slot(s) == (s.phase != P::on_tier));
    CHECK(strata::in_flight(s) == (s.phase != P::on_tier && s.phase != P::resident));
  }
}

TEST_CASE("the transition function is usable at compile time") {
  static_assert(strata::transition(st(P::on_tier, false), E::read) == st(P::reading, false));
  static_assert(!strata::transition(st(P::resident, true), E::drop).has_value());
  static_assert(!strata::transition(st(P::resident, false), E::write).has_value());
  CHECK(strata::to_string(E::d2h_done) == "d2h_done");
}

}  // namespace state_machine_test
