// splitcount.hpp from C++17: owners release once, a scope guard enters and
// leaves, try_charge answers false at a limit, other failures throw
// splitcount::error with the C status and the message, moves leave empty
// owners behind. Exits 0 and prints "hpp_test: N checks passed".
#include "splitcount.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <utility>
#include <vector>

static int checks = 0;

static void check(bool cond, const char *what, int line) {
  ++checks;
  if (!cond) {
    std::fprintf(stderr, "hpp_test.cpp:%d: %s failed; last error: %s\n", line,
                 what, splitcount_last_error());
    std::exit(1);
  }
}
#define CHECK(cond) check((cond), #cond, __LINE__)

// `expr` throws splitcount::error with code `e`; its message names `call`.
#define CHECK_THROWS(expr, e, call)                                       \
  do {                                                                    \
    bool thrown = false;                                                  \
    try {                                                                 \
      (void)(expr);                                                       \
    } catch (const splitcount::error &err) {                              \
      thrown = true;                                                      \
      CHECK(err.code() == splitcount::errc::e);                           \
      CHECK(std::strstr(err.what(), call) != nullptr);                    \
    }                                                                     \
    CHECK(thrown);                                                        \
  } while (0)

int main() {
  CHECK(splitcount::version() == std::to_string(SPLITCOUNT_VERSION_MAJOR) +
                                     "." +
                                     std::to_string(SPLITCOUNT_VERSION_MINOR) +
                                     "." +
                                     std::to_string(SPLITCOUNT_VERSION_PATCH));

  {
    splitcount::hierarchy h = splitcount::hierarchy::for_bytes(
        {{"requests", SPLITCOUNT_STAT_EVENT}});
    splitcount::group root = h.root();
    CHECK(root.path() == "/");
    splitcount::group tenant = root.child("tenant-a");
    CHECK(tenant.path() == "/tenant-a");
    CHECK(h.lookup("/tenant-a").path() == "/tenant-a");

    // Limits: try_charge says no at the limit, the usage is exact after a
    // drain, and the refusal counted a max event.
    tenant.set_max(1 << 20);
    CHECK(tenant.max() == 1 << 20);
    CHECK(tenant.try_charge(4096));
    CHECK(!tenant.try_charge(2 << 20));
    CHECK(tenant.events().max == 1);
    tenant.uncharge(4096);
    CHECK(tenant.usage_exact() == 0);
    h.drain_stocks();
    CHECK(tenant.usage() == 0);
    CHECK(tenant.peak() >= 4096);

    // Bytes of typical sizes come from the stock (a 64 KiB batch).
    for (uint64_t n : {100u, 1000u, 4096u}) {
      CHECK(tenant.try_charge(n));
      tenant.uncharge(n);
    }
    CHECK(tenant.usage_exact() == 0);

    // A limit below the usage is refused with the numbers.
    tenant.force_charge(10);
    CHECK_THROWS(tenant.set_max(1), busy, "splitcount_group_set_max");
    tenant.uncharge(10);

    // Errors carry the C status and its name.
    CHECK_THROWS(root.child("a/b"), invalid, "splitcount_group_child");
    // A NUL inside a std::string would end the C string there: refused,
    // where it created "/a".
    CHECK_THROWS(root.child(std::string("a\0/../evil", 10)), invalid,
                 "splitcount_group_child");
    CHECK_THROWS(h.lookup(std::string("/tenant-a\0x", 11)), invalid,
                 "splitcount_hierarchy_lookup");
    CHECK_THROWS(h.stat_id(std::string("requests\0", 9)), invalid,
                 "splitcount_stat_id");
    // The call's name leads the message once.
    try {
      root.child("tenant-a");
    } catch (const splitcount::error &err) {
      const char *w = err.what();
      CHECK(std::strstr(w, "splitcount_group_child: splitcount_group_child") == nullptr);
    }
    CHECK_THROWS(root.child("tenant-a"), exists, "splitcount_group_child");
    CHECK_THROWS(h.lookup("/nobody"), not_found, "splitcount_hierarchy_lookup");
    CHECK_THROWS(h.stat_id("nothing"), not_found, "splitcount_stat_id");
    CHECK(splitcount::make_error_code(splitcount::errc::limit).message() ==
          splitcount_status_name(SPLITCOUNT_E_LIMIT));
    CHECK(std::string(splitcount::category().name()) == "splitcount");

    // Stats.
    uint32_t requests = h.stat_id("requests");
    tenant.mod_stat(requests, 3);
    root.flush(true);  // the subtree of the root: tenant-a's value reaches it
    CHECK(tenant.stat(requests) == 3);
    CHECK(root.stat(requests) == 3);
    CHECK_THROWS(tenant.mod_stat(requests, -1), invalid, "splitcount_group_mod_stat");

    // The unchecked charge path.
    splitcount_group_fast gf = tenant.fast();
    CHECK(splitcount_group_fast_try_charge(&gf, 1000) == SPLITCOUNT_OK);
    CHECK(splitcount_group_fast_try_charge(&gf, 2 << 20) == SPLITCOUNT_E_LIMIT);
    splitcount_group_fast_uncharge(&gf, 1000);
    CHECK(tenant.usage_exact() == 0);

    // check(): nothing breached.
    CHECK(!tenant.check());

    // Scopes nest and leave on destruction.
    {
      splitcount::scope outer(tenant);
      splitcount::group inner_group = tenant.child("inner");
      {
        splitcount::scope inner(inner_group);
      }
      CHECK(splitcount_leave() == SPLITCOUNT_OK);  // leaves `outer`
      CHECK(splitcount_enter(tenant.get()) == SPLITCOUNT_OK);  // for its guard
      inner_group.remove();
      CHECK(!inner_group);
    }
    CHECK(splitcount_leave() == SPLITCOUNT_E_STATE);  // every guard left

    // Moves: the moved-from owner is empty, the handle released once.
    splitcount::group moved = std::move(tenant);
    CHECK(!tenant);
    CHECK(moved.path() == "/tenant-a");
    splitcount::group other = root.child("tenant-b");
    other = std::move(moved);  // releases tenant-b's handle
    CHECK(other.path() == "/tenant-a");
    CHECK(h.lookup("/tenant-b").path() == "/tenant-b");  // the group stays

    // Threads charge one group.
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&other] {
        for (int i = 0; i < 10000; ++i) {
          if (other.try_charge(100)) other.uncharge(100);
        }
      });
    }
    for (auto &t : threads) t.join();
    h.drain_stocks();
    CHECK(other.usage() == 0);

    // A group removed, then used: throws; its owner is empty.
    splitcount::group gone = root.child("gone");
    splitcount::group gone2 = h.lookup("/gone");
    gone.remove();
    CHECK(gone2.is_removed());
    CHECK_THROWS(gone2.try_charge(1), removed, "splitcount_group_try_charge");
  }  // groups released, then the hierarchy destroyed (declared first)

  {
    // A group that outlives its hierarchy: calls throw, the destructor is
    // harmless.
    splitcount::group orphan;
    {
      splitcount::hierarchy h;
      orphan = h.root().child("orphan");
    }
    CHECK_THROWS(orphan.usage(), handle, "splitcount_group_usage");
  }

  {
    splitcount::counter c;  // the tree design
    for (int i = 0; i < 1000; ++i) c.add(1);
    CHECK(c.precise() == 1000);
    auto [under, over] = c.accuracy();
    CHECK(c.approximate() + static_cast<int64_t>(under) >= 1000);
    CHECK(c.approximate() - static_cast<int64_t>(over) <= 1000);
    CHECK(c.compare(1000) == 0 && c.compare(999) == 1 && c.compare(1001) == -1);
    c.set(5);
    CHECK(c.precise() == 5);
    splitcount_counter_fast f = c.fast();
    for (int i = 0; i < 100; ++i) splitcount_counter_fast_add(&f, 1);
    CHECK(c.precise() == 105);
    splitcount::counter atomic(SPLITCOUNT_DESIGN_ATOMIC);  // the macro is 0
    atomic.add(2);
    CHECK(atomic.precise() == 2);
    splitcount::counter moved = std::move(c);
    CHECK(moved.precise() == 105);
    CHECK_THROWS(splitcount::counter(SPLITCOUNT_DESIGN_TREE, 3), invalid,
                 "splitcount_counter_create");
  }

  std::printf("hpp_test: %d checks passed\n", checks);
  return 0;
}
