// Host build of one kernel module (prelude + module source in CSA_SOURCE,
// its entry in CSA_ENTRY): csa_host_launch runs a launch's blocks in order (or
// reversed), and the threads of a block as fibers with a real barrier
// (cuda_host_shim.h).
#include "host_headers.h"
#include CSA_SOURCE

// --ftz=true on the host: SSE's flush-to-zero and denormals-are-zero bits
// around one launch (the previous MXCSR is returned and put back after).
extern "C" unsigned int csa_host_flush_subnormals(int on)
{
    const unsigned int previous = _mm_getcsr();
    _mm_setcsr(on ? previous | 0x8040u : previous & ~0x8040u);
    return previous;
}

extern "C" void csa_host_restore_mxcsr(unsigned int previous) { _mm_setcsr(previous); }

// What the shared section holds before every block: the CUDA backend's poison
// byte, so a thread reading shared memory no thread of its block wrote sees
// the same garbage on every run, never a previous block's values.
extern "C" char __start_csa_shared[] __attribute__((weak));
extern "C" char __stop_csa_shared[] __attribute__((weak));
static const int SHARED_POISON = 0xA5;

namespace {

// Every argument arrives as a pointer to an 8-byte slot holding its value.
template <typename... Parameters, std::size_t... I>
void call_entry(void (*entry)(Parameters...), void* const* arguments, std::index_sequence<I...>)
{
    entry(*static_cast<std::decay_t<Parameters>*>(arguments[I])...);
}

template <typename... Parameters>
void call_entry(void (*entry)(Parameters...), void* const* arguments)
{
    call_entry(entry, arguments, std::index_sequence_for<Parameters...>{});
}

enum class FiberState { runnable, waiting, done };

struct Fiber {
    void* stack_pointer;
    FiberState state;
};

struct Block {
    void* const* arguments = nullptr;
    void* scheduler = nullptr;  // the scheduler's stack pointer while a fiber runs
    Fiber* fibers = nullptr;
    std::size_t capacity = 0;  // fibers allocated
    unsigned int current = 0;
};

Block block;

}  // namespace

// Saves the callee-saved registers on the current stack, stores its pointer in
// *from, and resumes the stack `to` (x86-64 System V; MXCSR and the x87
// control word are the launch's, the same on every fiber). A fiber that never
// ran starts in csa_host_fiber_main. Far cheaper than swapcontext, which
// makes a system call per switch.
extern "C" void csa_host_switch(void** from, void* to);
asm(R"(
    .text
    .p2align 4
    .type csa_host_switch, @function
csa_host_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size csa_host_switch, .-csa_host_switch
)");

namespace {

void wait_at_barrier()
{
    Fiber& fiber = block.fibers[block.current];
    fiber.state = FiberState::waiting;
    csa_host_switch(&fiber.stack_pointer, block.scheduler);
}

}  // namespace

extern "C" [[noreturn]] void csa_host_fiber_main()
{
    call_entry(CSA_ENTRY, block.arguments);
    Fiber& fiber = block.fibers[block.current];
    fiber.state = FiberState::done;
    csa_host_switch(&fiber.stack_pointer, block.scheduler);
    __builtin_unreachable();
}

namespace {

// A fresh fiber's stack: six zero registers for csa_host_switch to pop, then
// csa_host_fiber_main as the return address, entered as a called function is
// (the stack 16-byte aligned before the call's return address).
void* fresh_stack(char* top)
{
    void** frame = reinterpret_cast<void**>(top) - 8;
    for (int i = 0; i < 6; ++i) frame[i] = nullptr;
    frame[6] = reinterpret_cast<void*>(&csa_host_fiber_main);
    frame[7] = nullptr;
    return frame;
}

// One block: every live thread runs, in index order (reversed: from the last
// thread down), until it waits at the barrier or returns; rounds repeat until
// all have returned.
void run_block(unsigned int threads, char* stacks, std::size_t stride, bool reversed)
{
    for (unsigned int t = 0; t < threads; ++t) {
        block.fibers[t].stack_pointer = fresh_stack(stacks + (t + 1) * stride);
        block.fibers[t].state = FiberState::runnable;
    }
    for (bool live = true; live;) {
        live = false;
        for (unsigned int turn = 0; turn < threads; ++turn) {
            const unsigned int t = reversed ? threads - 1 - turn : turn;
            Fiber& fiber = block.fibers[t];
            if (fiber.state == FiberState::done) continue;
            live = true;
            fiber.state = FiberState::runnable;
            block.current = t;
            threadIdx.x = t;
            csa_host_switch(&block.scheduler, fiber.stack_pointer);
        }
    }
}

}  // namespace

// The launch. Thread t of a block runs on the stack ending at stacks + (t + 1)
// * stride (16-byte aligned; the caller maps them once per process, each above
// an inaccessible page, so an overflowing thread faults instead of writing
// into its neighbour's stack). `reversed` runs the blocks, and the threads of
// each block between barriers, from the last down (diff --repeat's even runs).
extern "C" void csa_host_launch(unsigned int grid, unsigned int threads, void* const* arguments, char* stacks,
                                std::size_t stride, int reversed)
{
    if (threads > block.capacity) {
        delete[] block.fibers;
        block.fibers = new Fiber[threads];
        block.capacity = threads;
    }
    gridDim.x = grid;
    blockDim.x = threads;
    block.arguments = arguments;
    csa_host_barrier = threads > 1 ? wait_at_barrier : nullptr;
    for (unsigned int turn = 0; turn < grid; ++turn) {
        const unsigned int b = reversed ? grid - 1 - turn : turn;
        blockIdx.x = b;
        if (__start_csa_shared != nullptr)
            memset(__start_csa_shared, SHARED_POISON, (std::size_t)(__stop_csa_shared - __start_csa_shared));
        if (threads > 1) {
            run_block(threads, stacks, stride, reversed != 0);
        } else {
            threadIdx.x = 0;
            call_entry(CSA_ENTRY, arguments);
        }
    }
    csa_host_barrier = nullptr;
}
