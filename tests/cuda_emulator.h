// A CPU emulator for the CUDA kernels in kernels/*.cu, for tests on machines
// without a GPU (tests/emulated_cuda.py compiles a kernel file with g++ after
// this header and calls it through ctypes with NumPy arrays).
//
// Every thread of a block is a fiber on one OS thread; blocks run
// one after another, so `__shared__` (static) and dynamic shared memory are
// simply per-block buffers.  A thread runs until it reaches a barrier:
//   __syncthreads()       waits for every thread of the block;
//   __shfl_*_sync(...), __ballot_sync(...), __syncwarp()
//                         wait for the 32 lanes of its warp (full masks only).
// The atomics (atomicMin of unsigned long long and int, atomicAdd of unsigned int) are
// plain read-modify-writes: no fiber switches inside them; __threadfence() is
// a no-op, since blocks run one after another.
// Misuse that is undefined behaviour on a GPU is reported, not guessed at:
// a __syncthreads() that some threads reach after others exited, a shuffle
// with lanes that exited or with a partial mask, and any deadlock.  Dynamic
// shared memory starts as 0xff bytes (NaN), so reads of unwritten slots show.
#pragma once

#include <ucontext.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <cstring>
#include <math.h>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static

struct dim3 {
    unsigned int x = 1, y = 1, z = 1;
};
using uint3 = dim3;

inline dim3 threadIdx, blockIdx, blockDim, gridDim;
constexpr int warpSize = 32;

namespace emu {

enum class State { runnable, at_block_barrier, at_warp_barrier, done };

// Switching fibers: on x86-64 a few instructions that keep what the System V
// ABI asks a call to preserve (rbx, rbp, r12-r15, the stack pointer, MXCSR and
// the x87 control word); ucontext elsewhere and under AddressSanitizer, which
// intercepts swapcontext (glibc's makes a system call per switch: the emulated
// kernels of a 250-point t-SNE fit took 4.4 s with it, 0.39 s without).
#if defined(__x86_64__) && !defined(__SANITIZE_ADDRESS__)
#define EMU_FAST_SWITCH 1
extern "C" void emu_switch(void** save_sp, void* load_sp);
asm(R"(
    .text
    .hidden emu_switch
    .globl emu_switch
    .type emu_switch, @function
emu_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    subq $8, %rsp
    stmxcsr (%rsp)
    fnstcw 4(%rsp)
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    ldmxcsr (%rsp)
    fldcw 4(%rsp)
    addq $8, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size emu_switch, .-emu_switch
)");
#endif

struct Context {
#ifdef EMU_FAST_SWITCH
    void* sp = nullptr;
#else
    ucontext_t uc;
#endif
};

inline void switch_context(Context& from, Context& to) {
#ifdef EMU_FAST_SWITCH
    emu_switch(&from.sp, to.sp);
#else
    swapcontext(&from.uc, &to.uc);
#endif
}

// Prepares `c` to run entry() on `stack` at its first switch; entry never returns.
inline void make_context(Context& c, std::vector<char>& stack, void (*entry)()) {
#ifdef EMU_FAST_SWITCH
    // From the top: a slot where entry's return address would be (so rsp is
    // 8 mod 16 at entry, as after a call), entry as emu_switch's return
    // address, six saved registers, MXCSR and the control word.
    auto top = reinterpret_cast<std::uintptr_t>(stack.data() + stack.size()) & ~std::uintptr_t(15);
    auto* slot = reinterpret_cast<std::uint64_t*>(top);
    slot[-1] = 0;
    slot[-2] = reinterpret_cast<std::uint64_t>(entry);
    for (int r = 3; r <= 8; ++r) slot[-r] = 0;
    std::uint32_t mxcsr;
    std::uint16_t control;
    asm volatile("stmxcsr %0" : "=m"(mxcsr));
    asm volatile("fnstcw %0" : "=m"(control));
    slot[-9] = 0;
    std::memcpy(&slot[-9], &mxcsr, 4);
    std::memcpy(reinterpret_cast<char*>(&slot[-9]) + 4, &control, 2);
    c.sp = &slot[-9];
#else
    getcontext(&c.uc);
    c.uc.uc_stack.ss_sp = stack.data();
    c.uc.uc_stack.ss_size = stack.size();
    c.uc.uc_link = nullptr;
    makecontext(&c.uc, entry, 0);
#endif
}

struct Fiber {
    Context context;
    State state = State::runnable;
    std::vector<char> stack;
};

inline constexpr std::size_t stack_bytes = 256 * 1024;
// Threads and blocks run in reverse order with -DEMU_REVERSE_ORDER: a result
// that changes with it depends on an order CUDA does not promise (a race).
#ifdef EMU_REVERSE_ORDER
inline constexpr bool reverse_order = true;
#else
inline constexpr bool reverse_order = false;
#endif
inline Context scheduler;
inline std::vector<Fiber> fibers;
inline int current = 0;
inline void (*block_body)() = nullptr;
inline std::string error;
inline std::vector<unsigned char> dynamic_shared;
// Shuffle exchange slots, double-buffered so one barrier per shuffle suffices:
// a lane can only reuse a parity after every lane passed the next shuffle.
inline std::vector<std::uint64_t> exchange[2];
inline std::vector<int> shuffle_parity;

inline void yield(State state) {
    fibers[current].state = state;
    switch_context(fibers[current].context, scheduler);
}

// Stops the calling thread for good and reports `message` from the launch.
inline void fail(const std::string& message) {
    if (error.empty()) error = message;
    yield(State::done);
}

inline void fiber_entry() {
    block_body();
    yield(State::done);     // never resumed
}

inline dim3 thread_index(unsigned int linear) {
    dim3 t;
    t.x = linear % blockDim.x;
    t.y = (linear / blockDim.x) % blockDim.y;
    t.z = linear / (blockDim.x * blockDim.y);
    return t;
}

// Releases a barrier that every live thread of its scope reached; returns
// whether anything was released.  Sets `error` on undefined behaviour.
inline bool release_barriers(int n) {
    int done = 0, at_block = 0;
    for (const Fiber& f : fibers) {
        done += f.state == State::done;
        at_block += f.state == State::at_block_barrier;
    }
    if (at_block > 0 && at_block + done == n) {
        if (done > 0) {
            error = "__syncthreads() reached after some threads of the block exited";
            return false;
        }
        for (Fiber& f : fibers) f.state = State::runnable;
        return true;
    }
    bool released = false;
    for (int base = 0; base < n; base += warpSize) {
        const int lanes = std::min(warpSize, n - base);
        int waiting = 0, exited = 0;
        for (int l = 0; l < lanes; ++l) {
            waiting += fibers[base + l].state == State::at_warp_barrier;
            exited += fibers[base + l].state == State::done;
        }
        if (waiting == 0) continue;
        if (waiting + exited == lanes && (exited > 0 || lanes < warpSize)) {
            error = "warp shuffle with lanes that exited or do not exist (full mask)";
            return false;
        }
        if (waiting == warpSize) {
            for (int l = 0; l < lanes; ++l) fibers[base + l].state = State::runnable;
            released = true;
        }
    }
    return released;
}

inline void run_block(int n) {
    for (int t = 0; t < n; ++t) {
        fibers[t].state = State::runnable;
        make_context(fibers[t].context, fibers[t].stack, fiber_entry);
        shuffle_parity[t] = 0;
    }
    std::fill(dynamic_shared.begin(), dynamic_shared.end(), 0xff);
    for (;;) {
        bool ran = false;
        for (int i = 0; i < n; ++i) {
            const int t = reverse_order ? n - 1 - i : i;
            if (fibers[t].state != State::runnable) continue;
            current = t;
            threadIdx = thread_index(t);
            switch_context(scheduler, fibers[t].context);
            ran = true;
            if (!error.empty()) return;
        }
        if (ran) continue;
        bool all_done = true;
        for (const Fiber& f : fibers) all_done = all_done && f.state == State::done;
        if (all_done) return;
        if (!release_barriers(n)) {
            if (error.empty()) error = "deadlock: threads wait at barriers that cannot complete";
            return;
        }
    }
}

template <typename... A, std::size_t... I>
void call(void (*kernel)(A...), void** args, std::index_sequence<I...>) {
    kernel(*static_cast<std::remove_cv_t<A>*>(args[I])...);
}

template <typename T>
constexpr const char* type_code() {
    using U = std::remove_cv_t<T>;
    if constexpr (std::is_pointer_v<U>) {
        using P = std::remove_cv_t<std::remove_pointer_t<U>>;
        if constexpr (std::is_same_v<P, float>) return "*f4";
        else if constexpr (std::is_same_v<P, double>) return "*f8";
        else if constexpr (std::is_same_v<P, long long>) return "*i8";
        else if constexpr (std::is_same_v<P, int>) return "*i4";
        else if constexpr (std::is_same_v<P, bool>) return "*b1";
        else if constexpr (std::is_same_v<P, unsigned char>) return "*u1";
        else if constexpr (std::is_same_v<P, unsigned int>) return "*u4";
        else if constexpr (std::is_same_v<P, unsigned long long>) return "*u8";
        else return "*?";
    } else if constexpr (std::is_same_v<U, float>) return "f4";
    else if constexpr (std::is_same_v<U, double>) return "f8";
    else if constexpr (std::is_same_v<U, long long>) return "i8";
    else if constexpr (std::is_same_v<U, int>) return "i4";
    else if constexpr (std::is_same_v<U, unsigned int>) return "u4";
    else if constexpr (std::is_same_v<U, bool>) return "b1";
    else return "?";
}

// Parameter types as "code,code,..."; a leading "c" marks a pointer to const.
template <typename... A>
std::string signature(void (*)(A...)) {
    std::string out;
    ((out += std::string(out.empty() ? "" : ",") +
             (std::is_const_v<std::remove_pointer_t<A>> && std::is_pointer_v<A> ? "c" : "") +
             type_code<A>()),
     ...);
    return out;
}

template <typename... A>
int launch(void (*kernel)(A...), const unsigned* grid, const unsigned* block,
           std::size_t shared_bytes, void** args, char* message, std::size_t message_size) {
    static void (*the_kernel)(A...);
    static void** the_args;
    the_kernel = kernel;
    the_args = args;
    block_body = [] { call(the_kernel, the_args, std::index_sequence_for<A...>{}); };
    gridDim = dim3{grid[0], grid[1], grid[2]};
    blockDim = dim3{block[0], block[1], block[2]};
    const int n = int(block[0] * block[1] * block[2]);
    error.clear();
    if (n < 1 || n > 1024) error = "block size must be 1..1024 threads";
    fibers.resize(n);
    for (Fiber& f : fibers) f.stack.resize(stack_bytes);
    for (auto& e : exchange) e.assign(n, 0);
    shuffle_parity.assign(n, 0);
    dynamic_shared.assign(shared_bytes, 0xff);
    const unsigned long long n_blocks = 1ull * grid[0] * grid[1] * grid[2];
    for (unsigned long long i = 0; i < n_blocks && error.empty(); ++i) {
        const unsigned long long b = reverse_order ? n_blocks - 1 - i : i;
        blockIdx = dim3{unsigned(b % grid[0]), unsigned(b / grid[0] % grid[1]),
                        unsigned(b / (1ull * grid[0] * grid[1]))};
        run_block(n);
    }
    std::snprintf(message, message_size, "%s", error.c_str());
    return error.empty() ? 0 : 1;
}

inline unsigned char* shared_memory() { return dynamic_shared.data(); }

template <typename T>
T shuffle(unsigned mask, T value, int src_lane) {
    static_assert(sizeof(T) <= sizeof(std::uint64_t), "shuffle of a type wider than 8 bytes");
    if (mask != 0xffffffffu) fail("the emulator supports full-warp shuffle masks only");
    const int parity = shuffle_parity[current];
    shuffle_parity[current] ^= 1;
    std::memcpy(&exchange[parity][current], &value, sizeof(T));
    yield(State::at_warp_barrier);
    const int base = current - current % warpSize;
    T out;
    std::memcpy(&out, &exchange[parity][base + (src_lane & (warpSize - 1))], sizeof(T));
    return out;
}

}  // namespace emu

inline void __syncthreads() { emu::yield(emu::State::at_block_barrier); }

template <typename T>
T __shfl_sync(unsigned mask, T value, int src_lane) {
    return emu::shuffle(mask, value, src_lane);
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T value, int lane_mask) {
    return emu::shuffle(mask, value, (emu::current % warpSize) ^ lane_mask);
}
inline unsigned __ballot_sync(unsigned mask, int predicate) {
    unsigned bits = predicate ? 1u << (emu::current % warpSize) : 0u;
    for (int offset = 16; offset > 0; offset >>= 1)
        bits |= emu::shuffle(mask, bits, (emu::current % warpSize) ^ offset);
    return bits;
}
inline void __syncwarp(unsigned mask = 0xffffffffu) { emu::shuffle(mask, 0, 0); }
inline int __ffs(int x) { return __builtin_ffs(x); }
// Fibers switch only at barriers and shuffles, so a plain read-modify-write is atomic.
inline unsigned long long atomicMin(unsigned long long* address, unsigned long long value) {
    const unsigned long long old = *address;
    if (value < old) *address = value;
    return old;
}
inline int atomicMin(int* address, int value) {
    const int old = *address;
    if (value < old) *address = value;
    return old;
}
inline unsigned atomicAdd(unsigned* address, unsigned value) {
    const unsigned old = *address;
    *address = old + value;
    return old;
}
inline void __threadfence() {}

// The fast intrinsics as the GPU computes them: __expf is ex2.approx of x log2(e)
// rounded to float (a relative error growing with |x|), __fdividef a reciprocal
// then a product (two roundings, 0 for |b| > 2^126).
inline float __expf(float x) { return std::exp2(x * 1.44269504f); }
inline float __fdividef(float a, float b) {
    return std::fabs(b) > 8.5070592e37f ? 0.0f : a * (1.0f / b);
}
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, 4); return i; }
inline double __longlong_as_double(long long i) { double d; std::memcpy(&d, &i, 8); return d; }
inline long long __double_as_longlong(double d) { long long i; std::memcpy(&i, &d, 8); return i; }

// CUDA's min/max are overloaded for every arithmetic type pair.
template <typename A, typename B>
std::common_type_t<A, B> min(A a, B b) { return b < a ? b : a; }
template <typename A, typename B>
std::common_type_t<A, B> max(A a, B b) { return a < b ? b : a; }

using std::exp;
using std::fma;
using std::isfinite;
using std::log;
using std::log1p;
using std::sqrt;

// extern "C" entry points for one kernel instantiation (emulated_cuda.py
// appends EMU_EXPORT(name<type>) after the kernel source).
#define EMU_EXPORT(...)                                                                      \
    extern "C" const char* emu_signature() {                                                 \
        static const std::string s = emu::signature(&__VA_ARGS__);                           \
        return s.c_str();                                                                    \
    }                                                                                        \
    extern "C" int emu_launch(const unsigned* grid, const unsigned* block,                   \
                              std::size_t shared_bytes, void** args, char* message,          \
                              std::size_t message_size) {                                    \
        return emu::launch(&__VA_ARGS__, grid, block, shared_bytes, args, message,           \
                           message_size);                                                    \
    }
