/// @file
/// @brief The ticket of a scheduler's moves, `ferry::basic_ticket<Backend>`, and the
/// scheduler's copy lanes (`ferry::lane`).
///
/// The ticket type itself is defined in tier/ticket.hpp (one ticket for the scheduler's
/// moves and the NVMe tier's transfers, with one drop rule: dropping a ticket neither
/// waits for nor cancels its move). For a scheduler's move: a copy between device and
/// host memory ends with a marker (a CUDA event) recorded behind its last chunk, and
/// `enqueue_wait` makes a stream wait for that marker; a move that involves the disk
/// completes on a host thread, and the stream waits for a host-signalled flag (CUDA:
/// `cuStreamWaitValue32` on mapped pinned memory; see transfer/device_backend.hpp). Where
/// the driver refuses stream memory operations, `enqueue_wait` on a disk move waits on the
/// host until the move has completed. States come from a pool of the scheduler
/// (detail/transfer/move_state.hpp), so a move allocates nothing once the pool has grown
/// to the number of moves in flight.
#pragma once

#include "ferry/detail/transfer/move_state.hpp"
#include "ferry/tier/ticket.hpp"
