//! `artune __worker`: one GPU's worker process, started by the coordinator (hidden; see
//! src/fabric/cuda/worker.rs for what it does and src/fabric/cuda/protocol.rs for how it talks).

use clap::Args;

#[derive(Args, Debug)]
pub struct WorkerArgs {
    /// CUDA ordinal of the GPU this worker owns.
    #[arg(long)]
    pub ordinal: usize,
    /// CPUs to pin to (a Linux cpulist, the GPU's affinity).
    #[arg(long)]
    pub cpus: Option<String>,
    /// Element types whose kernels to load (bf16,fp16,fp32); all where absent.
    #[arg(long, value_delimiter = ',')]
    pub dtypes: Vec<String>,
}

pub fn run(a: WorkerArgs) -> i32 {
    let dtypes = crate::fabric::cuda::worker::parse_dtypes(&a.dtypes);
    crate::fabric::cuda::worker::serve(a.ordinal, a.cpus.as_deref(), &dtypes)
}
