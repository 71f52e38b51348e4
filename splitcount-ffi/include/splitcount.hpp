/*
 * splitcount.hpp: C++17 wrappers over the C ABI of splitcount
 * (splitcount.h): owners that destroy or release their handle once, a
 * scope guard for the calling thread's current group, and errors as
 * exceptions carrying a std::error_code.
 *
 * Header-only; link the C library as for splitcount.h:
 *   c++ -std=c++17 app.cpp $(pkg-config --cflags --libs splitcount)
 *
 *   splitcount::hierarchy h = splitcount::hierarchy::for_bytes();
 *   splitcount::group tenant = h.root().child("tenant-a");
 *   tenant.set_max(64 << 20);
 *   if (!tenant.try_charge(4096)) { ... refused by a limit ... }
 *   tenant.uncharge(4096);
 *
 * Errors. Every call that fails throws splitcount::error, a
 * std::system_error whose code() is in splitcount::category() (the
 * SPLITCOUNT_E_* value, compared with the splitcount::errc enumerators)
 * and whose what() carries splitcount_last_error()'s message with the
 * numbers. Exceptions to that rule, where failing is the expected
 * answer: group::try_charge returns false when a limit refuses
 * (SPLITCOUNT_E_LIMIT) and group::check returns the code
 * (SPLITCOUNT_E_OVER_LIMIT) instead of throwing. Destructors never throw.
 *
 * Lifetimes. A hierarchy owns its handle; destroying it invalidates every
 * group handle obtained through it (C: splitcount_hierarchy_destroy), so a
 * group must not be used after its hierarchy is gone (its calls then
 * throw SPLITCOUNT_E_HANDLE; its destructor is harmless). A group owns one
 * handle on the group (released by its destructor; the group itself stays
 * until group::remove). Owners are move-only. Thread safety is the C
 * API's: calls on one object may run on any thread at once, except its
 * destruction (or remove) racing another call on it.
 */
#ifndef SPLITCOUNT_HPP
#define SPLITCOUNT_HPP

#include "splitcount.h"

#include <cstdint>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace splitcount {

/** The SPLITCOUNT_E_* codes, for comparing with an error's code(). */
enum class errc : int {
  null = SPLITCOUNT_E_NULL,
  handle = SPLITCOUNT_E_HANDLE,
  invalid = SPLITCOUNT_E_INVALID,
  limit = SPLITCOUNT_E_LIMIT,
  busy = SPLITCOUNT_E_BUSY,
  not_found = SPLITCOUNT_E_NOT_FOUND,
  exists = SPLITCOUNT_E_EXISTS,
  removed = SPLITCOUNT_E_REMOVED,
  state = SPLITCOUNT_E_STATE,
  panic = SPLITCOUNT_E_PANIC,
  buffer = SPLITCOUNT_E_BUFFER,
  over_limit = SPLITCOUNT_E_OVER_LIMIT,
};

namespace detail {
class category_impl final : public std::error_category {
 public:
  const char *name() const noexcept override { return "splitcount"; }
  std::string message(int status) const override {
    return splitcount_status_name(status);
  }
};

/** `message` led by `call`'s name once (the C API's messages often start
 * with it already). */
inline std::string with_call(const char *call, const std::string &message) {
  std::string prefix = std::string(call) + ": ";
  if (message.compare(0, prefix.size(), prefix) == 0) return message;
  return prefix + message;
}
}  // namespace detail

/** The error category of splitcount's status codes. */
inline const std::error_category &category() noexcept {
  static const detail::category_impl instance;
  return instance;
}

/** A status code of the C API as a std::error_code. */
inline std::error_code make_error_code(errc e) noexcept {
  return {static_cast<int>(e), category()};
}

/** A failed call: the status and splitcount_last_error()'s message. */
class error : public std::system_error {
 public:
  error(int status, const char *call)
      : std::system_error(status, category(),
                          detail::with_call(call, splitcount_last_error())) {}
  /** A failure the wrapper found itself, with its own message. */
  error(int status, const char *call, const std::string &message)
      : std::system_error(status, category(), detail::with_call(call, message)) {}
  /** The SPLITCOUNT_E_* value. */
  int status() const noexcept { return code().value(); }
};

namespace detail {
inline void check(int status, const char *call) {
  if (status != SPLITCOUNT_OK) throw error(status, call);
}

/** `s` as a C string for `call`; a NUL inside would cut it short there
 * (`"a\0/evil"` would name `a`): `errc::invalid`. */
inline const char *c_string(const std::string &s, const char *call) {
  if (s.find('\0') != std::string::npos)
    throw error(SPLITCOUNT_E_INVALID, call,
                "\"" + s.substr(0, s.find('\0')) +
                    "\\0...\" holds a NUL byte, where a C string would end");
  return s.c_str();
}

/**
 * The owner of one C handle, freed by `Free` once (its status ignored:
 * destructors never throw). Move-only; a moved-from owner is empty.
 */
template <typename T, int (*Free)(T *)>
class owner {
 public:
  /** Takes over a handle from the C API (may be null: empty). */
  explicit owner(T *handle = nullptr) noexcept : p_(handle) {}
  owner(const owner &) = delete;
  owner &operator=(const owner &) = delete;
  owner(owner &&other) noexcept : p_(std::exchange(other.p_, nullptr)) {}
  owner &operator=(owner &&other) noexcept {
    if (this != &other) {
      reset();
      p_ = std::exchange(other.p_, nullptr);
    }
    return *this;
  }
  ~owner() { reset(); }

  /** The C handle (still owned by this object). */
  T *get() const noexcept { return p_; }
  /** Give up ownership of the C handle. */
  T *release() noexcept { return std::exchange(p_, nullptr); }
  explicit operator bool() const noexcept { return p_ != nullptr; }

 protected:
  void reset() noexcept {
    if (p_ != nullptr) (void)Free(p_);
    p_ = nullptr;
  }
  T *p_;
};
}  // namespace detail

/** The library's version at run time ("MAJOR.MINOR.PATCH"). */
inline std::string version() { return splitcount_version(); }

/**
 * A group of a hierarchy: owns one handle, released when it goes (the
 * group stays until remove()).
 */
class group : public detail::owner<splitcount_group, splitcount_group_release> {
 public:
  using owner::owner;

  /** A new child named `name` of this (live) group. */
  group child(const std::string &name) const {
    splitcount_group *out = nullptr;
    detail::check(splitcount_group_child(
                      p_, detail::c_string(name, "splitcount_group_child"), &out),
                  "splitcount_group_child");
    return group(out);
  }

  /**
   * Remove the group (no live children, not the root); this object is
   * empty afterwards. Its usage stays counted at its ancestors.
   */
  void remove() {
    detail::check(splitcount_group_remove(p_), "splitcount_group_remove");
    p_ = nullptr;
  }

  /** "/" for the root, "/a/b" for a group below it. */
  std::string path() const {
    size_t needed = 0;
    int status = splitcount_group_path(p_, nullptr, 0, &needed);
    if (status != SPLITCOUNT_E_BUFFER)
      detail::check(status, "splitcount_group_path");
    std::string s(needed, '\0');
    detail::check(splitcount_group_path(p_, s.data(), s.size(), &needed),
                  "splitcount_group_path");
    s.resize(needed - 1);  // without the NUL
    return s;
  }

  bool is_removed() const {
    bool out = false;
    detail::check(splitcount_group_is_removed(p_, &out),
                  "splitcount_group_is_removed");
    return out;
  }

  void set_max(uint64_t max) {
    detail::check(splitcount_group_set_max(p_, max), "splitcount_group_set_max");
  }
  void set_high(uint64_t high) {
    detail::check(splitcount_group_set_high(p_, high),
                  "splitcount_group_set_high");
  }
  /** SPLITCOUNT_ENFORCE_REFUSE or SPLITCOUNT_ENFORCE_COOPERATIVE. */
  void set_enforcement(uint32_t enforcement) {
    detail::check(splitcount_group_set_enforcement(p_, enforcement),
                  "splitcount_group_set_enforcement");
  }
  void set_ceiling(uint64_t ceiling) {
    detail::check(splitcount_group_set_ceiling(p_, ceiling),
                  "splitcount_group_set_ceiling");
  }
  uint64_t max() const { return read(splitcount_group_max, "splitcount_group_max"); }
  uint64_t high() const { return read(splitcount_group_high, "splitcount_group_high"); }

  /**
   * Charge `n` units within the limits; false if a limit refused them
   * (splitcount_last_error() names it). Other errors throw.
   */
  bool try_charge(uint64_t n) {
    int status = splitcount_group_try_charge(p_, n);
    if (status == SPLITCOUNT_E_LIMIT) return false;
    detail::check(status, "splitcount_group_try_charge");
    return true;
  }
  /**
   * Charge `n` units that must not fail; past a max it is reported as a
   * breach that check() sees (see splitcount_group_charge).
   */
  void force_charge(uint64_t n) {
    detail::check(splitcount_group_charge(p_, n), "splitcount_group_charge");
  }
  void uncharge(uint64_t n) {
    detail::check(splitcount_group_uncharge(p_, n), "splitcount_group_uncharge");
  }

  /** Usage, stocked units included (what limits compare). */
  uint64_t usage() const { return read(splitcount_group_usage, "splitcount_group_usage"); }
  /** Usage without the units stocked for the subtree. */
  uint64_t usage_exact() const {
    return read(splitcount_group_usage_exact, "splitcount_group_usage_exact");
  }
  uint64_t stocked() const {
    return read(splitcount_group_stocked, "splitcount_group_stocked");
  }
  uint64_t stocked_subtree() const {
    return read(splitcount_group_stocked_subtree,
                "splitcount_group_stocked_subtree");
  }
  uint64_t peak() const { return read(splitcount_group_peak, "splitcount_group_peak"); }
  void reset_peak() {
    detail::check(splitcount_group_reset_peak(p_), "splitcount_group_reset_peak");
  }
  splitcount_events events() const {
    splitcount_events out{};
    detail::check(splitcount_group_events(p_, &out), "splitcount_group_events");
    return out;
  }

  /**
   * The checkpoint of cooperative enforcement: an empty code, or
   * errc::over_limit (splitcount_last_error() has the numbers). Other
   * errors throw.
   */
  std::error_code check() const {
    int status = splitcount_group_check(p_);
    if (status == SPLITCOUNT_E_OVER_LIMIT) return make_error_code(errc::over_limit);
    detail::check(status, "splitcount_group_check");
    return {};
  }
  void clear_breach() {
    detail::check(splitcount_group_clear_breach(p_),
                  "splitcount_group_clear_breach");
  }

  void mod_stat(uint32_t item, int64_t delta) {
    detail::check(splitcount_group_mod_stat(p_, item, delta),
                  "splitcount_group_mod_stat");
  }
  int64_t stat(uint32_t item) const {
    int64_t out = 0;
    detail::check(splitcount_group_stat(p_, item, &out), "splitcount_group_stat");
    return out;
  }
  int64_t stat_local(uint32_t item) const {
    int64_t out = 0;
    detail::check(splitcount_group_stat_local(p_, item, &out),
                  "splitcount_group_stat_local");
    return out;
  }
  /**
   * The unchecked charge path (splitcount_group_fast_get): valid while
   * this handle lives.
   */
  splitcount_group_fast fast() const {
    splitcount_group_fast out{};
    detail::check(splitcount_group_fast_get(p_, &out), "splitcount_group_fast_get");
    return out;
  }

  /** Flush the subtree's statistics; whether it flushed. */
  bool flush(bool force = false) {
    bool flushed = false;
    detail::check(splitcount_group_flush(p_, force, &flushed),
                  "splitcount_group_flush");
    return flushed;
  }

 private:
  template <typename F>
  uint64_t read(F f, const char *call) const {
    uint64_t out = 0;
    detail::check(f(p_, &out), call);
    return out;
  }
};

/** A hierarchy of groups: owns its handle, destroyed when it goes. */
class hierarchy
    : public detail::owner<splitcount_hierarchy, splitcount_hierarchy_destroy> {
 public:
  using owner::owner;
  /** No stat items, the default stock (64-unit batch, 63 slots). */
  hierarchy() : hierarchy(std::vector<splitcount_stat_item>{}) {}

  /**
   * Groups carrying `items`, with the stock's batch and slots (see
   * splitcount_hierarchy_create_with: the slack they imply).
   */
  explicit hierarchy(const std::vector<splitcount_stat_item> &items,
                     uint64_t stock_batch = SPLITCOUNT_STOCK_BATCH_DEFAULT,
                     uint32_t stock_slots = SPLITCOUNT_STOCK_SLOTS_MAX) {
    detail::check(splitcount_hierarchy_create_with(
                      items.empty() ? nullptr : items.data(), items.size(),
                      stock_batch, stock_slots, &p_),
                  "splitcount_hierarchy_create_with");
  }

  /** A hierarchy charged in bytes: SPLITCOUNT_STOCK_BATCH_BYTES. */
  static hierarchy for_bytes(const std::vector<splitcount_stat_item> &items = {}) {
    return hierarchy(items, SPLITCOUNT_STOCK_BATCH_BYTES, SPLITCOUNT_STOCK_SLOTS_MAX);
  }

  /** A new handle on the root group. */
  group root() const {
    splitcount_group *out = nullptr;
    detail::check(splitcount_hierarchy_root(p_, &out), "splitcount_hierarchy_root");
    return group(out);
  }
  /** A new handle on the live group at `path` ("/a/b"). */
  group lookup(const std::string &path) const {
    splitcount_group *out = nullptr;
    detail::check(
        splitcount_hierarchy_lookup(
            p_, detail::c_string(path, "splitcount_hierarchy_lookup"), &out),
        "splitcount_hierarchy_lookup");
    return group(out);
  }
  /** The id of stat item `name`. */
  uint32_t stat_id(const std::string &name) const {
    uint32_t out = 0;
    detail::check(
        splitcount_stat_id(p_, detail::c_string(name, "splitcount_stat_id"), &out),
        "splitcount_stat_id");
    return out;
  }
  /** Return every stocked unit to the usage counters; the units returned. */
  uint64_t drain_stocks() {
    uint64_t units = 0;
    detail::check(splitcount_hierarchy_drain_stocks(p_, &units),
                  "splitcount_hierarchy_drain_stocks");
    return units;
  }
};

/**
 * The calling thread's current group for the guard's lifetime
 * (splitcount_enter / splitcount_leave): what the preload's malloc
 * charges, for a group of its hierarchy. Guards nest; each leaves on the
 * thread that entered (not movable).
 */
class scope {
 public:
  explicit scope(const group &g) {
    detail::check(splitcount_enter(g.get()), "splitcount_enter");
  }
  scope(const scope &) = delete;
  scope &operator=(const scope &) = delete;
  ~scope() { (void)splitcount_leave(); }
};

/** A split counter: owns its handle, destroyed when it goes. */
class counter : public detail::owner<splitcount_counter, splitcount_counter_destroy> {
 public:
  /** SPLITCOUNT_DESIGN_*; batch 0 is the design's default. */
  explicit counter(uint32_t design = SPLITCOUNT_DESIGN_TREE, uint64_t batch = 0) {
    detail::check(splitcount_counter_create(design, batch, &p_),
                  "splitcount_counter_create");
  }

  void add(int64_t delta) {
    detail::check(splitcount_counter_add(p_, delta), "splitcount_counter_add");
  }
  /** The cheap read, within the design's error bound. */
  int64_t approximate() const {
    int64_t out = 0;
    detail::check(splitcount_counter_approximate(p_, &out),
                  "splitcount_counter_approximate");
    return out;
  }
  /** The exact sum. */
  int64_t precise() const {
    int64_t out = 0;
    detail::check(splitcount_counter_precise(p_, &out), "splitcount_counter_precise");
    return out;
  }
  /** The error bound of approximate(): {under, over}. */
  std::pair<uint64_t, uint64_t> accuracy() const {
    uint64_t under = 0, over = 0;
    detail::check(splitcount_counter_accuracy(p_, &under, &over),
                  "splitcount_counter_accuracy");
    return {under, over};
  }
  /** -1, 0 or 1 as the exact value compares with `v`. */
  int compare(int64_t v) const {
    int out = 0;
    detail::check(splitcount_counter_compare(p_, v, &out), "splitcount_counter_compare");
    return out;
  }
  void set(int64_t v) {
    detail::check(splitcount_counter_set(p_, v), "splitcount_counter_set");
  }
  /**
   * The fast path (splitcount_counter_fast_get), for
   * splitcount_counter_fast_add: valid while this counter lives.
   */
  splitcount_counter_fast fast() const {
    splitcount_counter_fast out{};
    detail::check(splitcount_counter_fast_get(p_, &out), "splitcount_counter_fast_get");
    return out;
  }
};

}  // namespace splitcount

namespace std {
template <>
struct is_error_code_enum<splitcount::errc> : true_type {};
}  // namespace std

#endif /* SPLITCOUNT_HPP */
