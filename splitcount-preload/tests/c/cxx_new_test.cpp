// C++'s operator new and delete under the preload: every form reaches the
// preload's allocation (so its blocks are charged, whatever allocator the
// process has loaded besides), a refusal at a limit reaches the program as
// the new-handler and then std::bad_alloc, and the nothrow forms return
// null. Prints what it saw; the Rust test reads it with the report.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <vector>

static char *reserve = nullptr;
static int handler_calls = 0;

// Frees the reserve once, then uninstalls itself: the next failure throws.
static void give_back_the_reserve() {
    handler_calls++;
    delete[] reserve;
    reserve = nullptr;
    std::set_new_handler(nullptr);
}

struct alignas(64) Line {
    char bytes[64];
};

int main(int argc, char **argv) {
    // Each form once, its block checked and written.
    char *one = new char[100];
    one[99] = 1;
    delete[] one;
    auto *line = new Line;
    if (reinterpret_cast<std::uintptr_t>(line) % 64 != 0) {
        std::printf("misaligned\n");
        return 1;
    }
    line->bytes[63] = 1;
    delete line;
    auto *page = static_cast<char *>(::operator new(5000, std::align_val_t(4096)));
    if (reinterpret_cast<std::uintptr_t>(page) % 4096 != 0) {
        std::printf("misaligned page\n");
        return 1;
    }
    page[4999] = 1;
    ::operator delete(page, 5000, std::align_val_t(4096));
    int *sized = new int(7);
    ::operator delete(sized, sizeof(int));
    // A size no allocator gives: null from the nothrow forms.
    void *huge = ::operator new(SIZE_MAX / 2, std::nothrow);
    void *huge_aligned = ::operator new[](SIZE_MAX / 2, std::align_val_t(64), std::nothrow);
    std::printf("nothrow_null=%d\n", huge == nullptr && huge_aligned == nullptr);

    // Strings until the limit (if any) refuses: the handler runs once,
    // then std::bad_alloc.
    long long megabytes = argc > 1 ? std::atoll(argv[1]) : 16;
    reserve = new char[64 * 1024];
    std::set_new_handler(give_back_the_reserve);
    std::vector<std::string> held;
    bool caught = false;
    try {
        for (long long i = 0; i < megabytes * 1024 * 1024 / 128; i++) {
            held.emplace_back(100, 'x');
        }
    } catch (const std::bad_alloc &) {
        caught = true;
    }
    std::size_t count = held.size();
    held.clear();
    held.shrink_to_fit();
    std::printf("strings=%zu caught=%d handler_calls=%d\n", count, caught, handler_calls);
    delete[] reserve;
    return 0;
}
