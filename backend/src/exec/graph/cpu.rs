//! Runs a [`Plan`] on the CPU: kernels.cu compiled by the host C++
//! compiler over `cpu_shim.cpp` (backend/build.rs), each launch stepped
//! through its grid one thread at a time. The reference the GPU path is
//! checked against (the kernels and the plan are the same ones).

use super::plan::{Plan, SymArgs};
use super::GraphError;

extern "C" {
    fn symphony_graph_cpu_launch(
        id: u32,
        arena: *mut f32,
        args: *const SymArgs,
        blocks: u32,
        threads: u32,
    ) -> i32;
}

/// A plan's arena on the host, the weights in place.
pub fn arena(plan: &Plan) -> Vec<f32> {
    let mut a = vec![0.0f32; plan.arena_len as usize];
    a[..plan.weights.len()].copy_from_slice(&plan.weights);
    a
}

/// Runs `plan` over `arena` (from [`arena`]): `input` is the batch's
/// input (`plan.input_len()` floats); returns the output.
pub fn run(plan: &Plan, arena: &mut [f32], input: &[f32]) -> Result<Vec<f32>, GraphError> {
    plan.validate()?;
    if arena.len() as u64 != plan.arena_len || input.len() as u64 != plan.input_len() {
        return Err(GraphError::Plan("arena or input of the wrong length".into()));
    }
    let at = plan.input.0 as usize;
    arena[at..at + input.len()].copy_from_slice(input);
    for i in 0..plan.launches.len() {
        launch(plan, arena, i)?;
    }
    let o = plan.output.0 as usize;
    Ok(arena[o..o + plan.output_len() as usize].to_vec())
}

/// Runs launch `i` of `plan` alone over `arena` (checked against it).
pub fn launch(plan: &Plan, arena: &mut [f32], i: usize) -> Result<(), GraphError> {
    let l = plan.launches.get(i).ok_or_else(|| GraphError::Plan(format!("no launch {i}")))?;
    let inside = |&(off, len): &(u64, u64)| off.checked_add(len).is_some_and(|e| e <= arena.len() as u64);
    if !l.touches.iter().all(inside) || l.elements() == 0 {
        return Err(GraphError::Plan(format!("launch {i} ({}) outside the arena", l.kernel.name())));
    }
    let (blocks, threads) = l.grid();
    // SAFETY: every range the launch touches is inside `arena` (checked
    // above); the kernel indexes only within those ranges (its arguments
    // and ranges come from the same shapes in lowering) and runs to
    // completion before returning; `args` outlives the call.
    let rc = unsafe { symphony_graph_cpu_launch(l.kernel as u32, arena.as_mut_ptr(), &l.args, blocks, threads) };
    if rc != 0 {
        return Err(GraphError::Plan(format!("kernel {} unknown to the CPU runner", l.kernel.name())));
    }
    Ok(())
}
