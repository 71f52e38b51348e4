// A thread touches a thread_local object with a destructor while the
// process is at its limit: glibc's registration of the destructor
// allocates, and glibc ends the process if that fails ("failed to
// register TLS destructor"). The preload registers with accounting off:
// the program goes on.
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <new>
#include <string>
#include <thread>

struct Held {
    std::string s;
    ~Held() {}
};

thread_local Held held;
static std::atomic<bool> full{false};

int main() {
    std::setvbuf(stdout, nullptr, _IONBF, 0);
    static void *blocks[200000];
    int n = 0;
    std::thread t([] {
        while (!full) {
            std::this_thread::yield();
        }
        try {
            held.s = "x";
            std::puts("thread_local set");
        } catch (const std::bad_alloc &) {
            std::puts("thread_local refused");
        }
    });
    // The process at its limit: malloc refuses.
    while (n < 200000) {
        void *p = std::malloc(100);
        if (p == nullptr) {
            break;
        }
        blocks[n++] = p;
    }
    full = true;
    t.join();
    std::printf("survived full=%d\n", n < 200000);
    for (int i = 0; i < n; i++) {
        std::free(blocks[i]);
    }
    return 0;
}
