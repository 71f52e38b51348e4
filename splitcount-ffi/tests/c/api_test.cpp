// The C API from C++: the header compiles as C++ (extern "C"), handles go
// into RAII owners, threads from std::thread charge groups under a shared
// limit, and bad handles give error codes. Exits 0 and prints
// "api_test_cpp: N checks passed" when every check holds.
#include "splitcount.h"

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

static int checks = 0;

static void check(bool cond, const char *what, int line) {
  ++checks;
  if (!cond) {
    std::fprintf(stderr, "api_test.cpp:%d: %s failed; last error: %s\n", line,
                 what, splitcount_last_error());
    std::exit(1);
  }
}
#define CHECK(cond) check((cond), #cond, __LINE__)

// Owners that destroy or release their handle once.
struct HierarchyDeleter {
  void operator()(splitcount_hierarchy *h) const {
    CHECK(splitcount_hierarchy_destroy(h) == SPLITCOUNT_OK);
  }
};
struct GroupDeleter {
  void operator()(splitcount_group *g) const {
    CHECK(splitcount_group_release(g) == SPLITCOUNT_OK);
  }
};
using Hierarchy = std::unique_ptr<splitcount_hierarchy, HierarchyDeleter>;
using Group = std::unique_ptr<splitcount_group, GroupDeleter>;

static Group child(splitcount_group *parent, const std::string &name) {
  splitcount_group *g = nullptr;
  CHECK(splitcount_group_child(parent, name.c_str(), &g) == SPLITCOUNT_OK);
  return Group(g);
}

static uint64_t usage(splitcount_group *g) {
  uint64_t v = 0;
  CHECK(splitcount_group_usage(g, &v) == SPLITCOUNT_OK);
  return v;
}

int main() {
  splitcount_hierarchy *raw = nullptr;
  CHECK(splitcount_hierarchy_create(nullptr, 0, &raw) == SPLITCOUNT_OK);
  Hierarchy h(raw);
  splitcount_group *root_raw = nullptr;
  CHECK(splitcount_hierarchy_root(h.get(), &root_raw) == SPLITCOUNT_OK);
  Group root(root_raw);
  Group tenants = child(root.get(), "tenants");
  CHECK(splitcount_group_set_max(tenants.get(), 100000) == SPLITCOUNT_OK);

  // Eight threads, each its own tenant, charging units of 10 until the
  // shared limit refuses: never more than the limit is charged.
  std::vector<Group> groups;
  for (int i = 0; i < 8; ++i)
    groups.push_back(child(tenants.get(), "t" + std::to_string(i)));
  std::atomic<uint64_t> accepted{0};
  std::atomic<int> other_errors{0};
  std::vector<std::thread> threads;
  for (auto &g : groups) {
    splitcount_group *gp = g.get();
    threads.emplace_back([gp, &accepted, &other_errors] {
      for (int i = 0; i < 5000; ++i) {
        int rc = splitcount_group_try_charge(gp, 10);
        if (rc == SPLITCOUNT_OK)
          accepted += 10;
        else if (rc != SPLITCOUNT_E_LIMIT)
          ++other_errors;
      }
    });
  }
  for (auto &t : threads) t.join();
  CHECK(other_errors == 0);
  CHECK(accepted <= 100000);
  CHECK(accepted >= 100000 - 8 * 10);
  CHECK(usage(tenants.get()) == accepted.load());
  splitcount_events ev{};
  CHECK(splitcount_group_events(tenants.get(), &ev) == SPLITCOUNT_OK);
  CHECK(ev.max > 0);
  for (auto &g : groups) CHECK(splitcount_group_uncharge(g.get(), usage(g.get())) == SPLITCOUNT_OK);
  CHECK(splitcount_hierarchy_drain_stocks(h.get(), nullptr) == SPLITCOUNT_OK);
  CHECK(usage(tenants.get()) == 0);

  // Bad handles: a released one, a made-up one, NULL, a counter handle
  // used as a group.
  splitcount_group *gone = nullptr;
  CHECK(splitcount_hierarchy_lookup(h.get(), "/tenants/t0", &gone) == SPLITCOUNT_OK);
  CHECK(splitcount_group_release(gone) == SPLITCOUNT_OK);
  CHECK(splitcount_group_try_charge(gone, 1) == SPLITCOUNT_E_HANDLE);
  CHECK(splitcount_group_release(gone) == SPLITCOUNT_E_HANDLE);
  CHECK(splitcount_group_try_charge(reinterpret_cast<splitcount_group *>(0xdeadbeef), 1) ==
        SPLITCOUNT_E_HANDLE);
  CHECK(splitcount_group_try_charge(nullptr, 1) == SPLITCOUNT_E_HANDLE);
  splitcount_counter *c = nullptr;
  CHECK(splitcount_counter_create(SPLITCOUNT_DESIGN_BATCHED, 0, &c) == SPLITCOUNT_OK);
  CHECK(splitcount_group_try_charge(reinterpret_cast<splitcount_group *>(c), 1) ==
        SPLITCOUNT_E_HANDLE);
  CHECK(std::string(splitcount_last_error()).find("not a live group handle") != std::string::npos);
  CHECK(splitcount_counter_destroy(c) == SPLITCOUNT_OK);
  CHECK(splitcount_counter_destroy(c) == SPLITCOUNT_E_HANDLE);

  // Removal releases the handle: the owner must not release it again.
  Group last = child(tenants.get(), "last");
  CHECK(splitcount_group_remove(last.release()) == SPLITCOUNT_OK);

  // The group handles are released before the hierarchy is destroyed
  // (which would release them itself: their owners' releases would then
  // be SPLITCOUNT_E_HANDLE).
  for (auto &g : groups) g.reset();
  tenants.reset();
  root.reset();
  h.reset();
  std::printf("api_test_cpp: %d checks passed\n", checks);
  return 0;
}
