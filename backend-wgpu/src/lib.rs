//! kiln's WebGPU backend (wgpu + our own WGSL in `shaders/`): Metal, Vulkan and DX12.
//!
//! Weights are uploaded once and stay in their block format on the device; the kernels decode
//! them. Activations stay on the device between ops, and ops are recorded into a few command
//! buffers per step (see `device`). `supports_op` answers exactly what the kernels in `ops/`
//! pass the conformance suite for; the executor runs everything else on the CPU reference,
//! counted. No kernel needs shader-f16 or subgroups (f16 data is unpacked from 32-bit words),
//! so every adapter runs the same set.

mod device;
pub mod kernels;
mod ops;

use kiln_core::backend::{check_call, Backend, Capabilities, LocalFuture};
use kiln_core::op::{Op, OpDesc};
use kiln_core::tensor::{BackendId, Tensor, TensorDesc};
use kiln_core::Error;

/// The wgpu backends kiln uses: Vulkan, Metal, DX12 (not GL, whose compute is too limited);
/// in a browser, its WebGPU.
#[cfg(not(target_arch = "wasm32"))]
pub(crate) const BACKENDS: wgpu::Backends = wgpu::Backends::PRIMARY;
#[cfg(target_arch = "wasm32")]
pub(crate) const BACKENDS: wgpu::Backends = wgpu::Backends::BROWSER_WEBGPU;

pub(crate) const NO_ADAPTER: &str = "wgpu: no WebGPU adapter found (needs a Vulkan, Metal or DX12 driver; on Linux without a GPU, Mesa's lavapipe: apt-get install mesa-vulkan-drivers)";

pub(crate) fn instance() -> wgpu::Instance {
    let mut desc = wgpu::InstanceDescriptor::new_without_display_handle();
    desc.backends = BACKENDS;
    wgpu::Instance::new(desc)
}

/// One adapter as wgpu reports it.
#[derive(Clone, Debug)]
pub struct AdapterSummary {
    pub name: String,
    pub api: String,
    pub device_type: String,
    pub driver: String,
}

/// Every Vulkan, Metal or DX12 adapter wgpu can see. Never panics; an empty list when the
/// machine has no usable driver.
#[cfg(not(target_arch = "wasm32"))]
pub fn adapters() -> Vec<AdapterSummary> {
    let found = pollster::block_on(instance().enumerate_adapters(BACKENDS));
    found
        .iter()
        .map(|a| {
            let info = a.get_info();
            AdapterSummary {
                name: info.name,
                api: format!("{:?}", info.backend),
                device_type: format!("{:?}", info.device_type),
                driver: format!("{} {}", info.driver, info.driver_info)
                    .trim()
                    .to_string(),
            }
        })
        .collect()
}

/// The WebGPU backend on one adapter.
pub struct WgpuBackend {
    dev: device::Device,
}

/// Opens the WebGPU backend on the best adapter (a discrete GPU first;
/// `KILN_WGPU_ADAPTER=<name substring>` picks one).
#[cfg(not(target_arch = "wasm32"))]
pub fn open() -> kiln_core::Result<std::sync::Arc<dyn Backend>> {
    Ok(std::sync::Arc::new(WgpuBackend::open()?))
}

impl WgpuBackend {
    #[cfg(not(target_arch = "wasm32"))]
    pub fn open() -> kiln_core::Result<WgpuBackend> {
        Ok(WgpuBackend {
            dev: device::Device::open()?,
        })
    }

    /// Opens the backend without blocking (what a browser needs: its adapter and device
    /// arrive through the event loop).
    pub async fn open_async() -> kiln_core::Result<WgpuBackend> {
        Ok(WgpuBackend {
            dev: device::Device::open_async().await?,
        })
    }
}

impl Backend for WgpuBackend {
    fn name(&self) -> &str {
        "wgpu"
    }
    fn id(&self) -> BackendId {
        self.dev.id
    }
    fn capabilities(&self) -> &Capabilities {
        &self.dev.caps
    }
    fn alloc(&self, desc: &TensorDesc) -> kiln_core::Result<Tensor> {
        self.dev.timed(|| self.dev.alloc(desc))
    }
    fn upload(&self, dst: &Tensor, bytes: &[u8]) -> kiln_core::Result<()> {
        self.dev.timed(|| self.dev.upload(dst, bytes))
    }
    fn download(&self, src: &Tensor) -> kiln_core::Result<Vec<u8>> {
        self.dev.download(src)
    }
    fn download_async<'a>(
        &'a self,
        src: &'a Tensor,
    ) -> LocalFuture<'a, kiln_core::Result<Vec<u8>>> {
        Box::pin(self.dev.download_async(src))
    }
    fn supports_op(&self, desc: &OpDesc) -> bool {
        ops::supports(&self.dev, desc)
    }
    fn execute(&self, op: &Op, inputs: &[&Tensor], outputs: &[&Tensor]) -> kiln_core::Result<()> {
        let desc = check_call(self, op, inputs, outputs)?;
        if !ops::supports(&self.dev, &desc) {
            return Err(Error::backend(
                "wgpu",
                format!("{} is not supported here: {}", op.name(), desc_line(&desc)),
            ));
        }
        self.dev
            .timed(|| ops::execute(&self.dev, op, inputs, outputs))
    }
    fn synchronize(&self) -> kiln_core::Result<()> {
        self.dev.wait()
    }
    fn submit_stats(&self) -> Option<kiln_core::backend::SubmitStats> {
        Some(self.dev.submit_stats())
    }
}

fn desc_line(d: &OpDesc) -> String {
    let list = |v: &[TensorDesc]| {
        v.iter()
            .map(|t| t.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    format!("inputs {}; outputs {}", list(&d.inputs), list(&d.outputs))
}

/// Parses and validates WGSL source with naga; the error names the line and the problem.
pub fn validate_wgsl(name: &str, source: &str) -> Result<(), String> {
    let module = naga::front::wgsl::parse_str(source)
        .map_err(|e| format!("{name}: {}", e.emit_to_string(source)))?;
    let mut v = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    );
    v.validate(&module)
        .map_err(|e| format!("{name}: {}", e.emit_to_string(source)))?;
    Ok(())
}

/// The shaders directory of the source tree.
pub fn shader_dir() -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../shaders")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shader_in_the_tree_belongs_to_a_kernel() {
        // Kernels are validated as built (templates filled in, helpers prepended) by
        // `every_declared_kernel_builds_and_has_its_entry_point`; this makes sure no family
        // file escapes that by not being declared.
        let dir = shader_dir();
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).expect("shaders/ exists") {
            let path = entry.expect("readable entry").path();
            if path.extension().is_some_and(|e| e == "wgsl") {
                let stem = path.file_stem().and_then(|s| s.to_str()).unwrap_or("");
                assert!(
                    kernels::all().any(|k| k.file == stem),
                    "{} declares no kernel (kernels.rs' tables or an op family's file in ops/)",
                    path.display()
                );
                n += 1;
            }
        }
        assert!(n > 0, "no shaders in {}", dir.display());
    }

    #[test]
    fn the_validator_rejects_a_broken_shader() {
        let good = "@group(0) @binding(0) var<storage, read_write> y: array<f32>;\n@compute @workgroup_size(64) fn main(@builtin(global_invocation_id) g: vec3<u32>) { y[g.x] = 2.0 * y[g.x]; }\n";
        assert!(validate_wgsl("good", good).is_ok());
        // A type error: f32 assigned from a vec2.
        let bad = good.replace("2.0 * y[g.x]", "vec2<f32>(1.0, 2.0)");
        let err = validate_wgsl("bad", &bad).unwrap_err();
        assert!(err.contains("bad"), "{err}");
    }

    #[test]
    fn open_never_panics() {
        match open() {
            Ok(b) => println!("wgpu backend on {}", b.capabilities().device),
            Err(Error::NotAvailable(msg)) => assert!(msg.starts_with("wgpu:"), "{msg}"),
            Err(e) => panic!("unexpected error {e}"),
        }
    }

    #[test]
    fn every_declared_kernel_builds_and_has_its_entry_point() {
        let mut names = std::collections::HashSet::new();
        for k in kernels::all() {
            assert!(names.insert(k.entry), "{} declared twice", k.entry);
            let src = k.source();
            let module = naga::front::wgsl::parse_str(&src)
                .unwrap_or_else(|e| panic!("{}: {}", k.entry, e.emit_to_string(&src)));
            if let Err(e) = validate_wgsl(k.entry, &src) {
                panic!("{e}");
            }
            assert!(
                module.entry_points.iter().any(|e| e.name == k.entry),
                "{}: no such entry point in shaders/{}.wgsl",
                k.entry,
                k.file
            );
        }
        println!("{} kernels validated", names.len());
    }

    /// `iquant.wgsl` reads the grid table where the launcher binds it and finds each grid at
    /// the offset kiln_core lays it out at.
    #[test]
    fn the_grid_table_offsets_agree_with_the_core_layout() {
        let src = include_str!("../../shaders/common/iquant.wgsl");
        assert!(src.contains(&format!(
            "@binding({}) var<storage, read> iq_grid: array<u32>;",
            device::IQ_GRID_BINDING
        )));
        for (name, at) in kiln_core::quant::IQ_GRID_OFFSETS {
            let decl = format!("const {name}_AT = {at}u;");
            assert!(src.contains(&decl), "iquant.wgsl has no `{decl}`");
        }
        assert_eq!(
            kiln_core::quant::iq_grid_words().len(),
            kiln_core::quant::IQ_GRID_WORDS
        );
    }

    /// Every weight format has its kernels, once.
    #[test]
    fn every_weight_format_has_its_kernels() {
        use kiln_core::DType;
        let formats: Vec<_> = DType::ALL.iter().filter(|d| !d.is_int()).copied().collect();
        let mut listed = kernels::FORMATS.to_vec();
        listed.sort_by_key(|d| formats.iter().position(|f| f == d));
        assert_eq!(listed, formats);
        for &d in &formats {
            for k in [
                kernels::mat_vec(d),
                kernels::mat_mul(d),
                kernels::get_rows(d),
                kernels::mat_mul_id(d),
            ] {
                let k = k.unwrap_or_else(|| panic!("no kernel for {d}"));
                assert!(
                    k.entry.ends_with(&d.name().to_lowercase()),
                    "{} for {d}",
                    k.entry
                );
            }
        }
    }
}
