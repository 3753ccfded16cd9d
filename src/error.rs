//! The one error type of the engine.
//!
//! Every failure a caller can provoke — a wrong shape, a mask that does not
//! broadcast, a problem larger than the adapter allows, a lost device — comes
//! back as a variant of [`Error`] that names the offending sizes and says what
//! to do. The engine never panics on caller input.

/// Shorthand for `std::result::Result<T, webattn::Error>`.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in webattn.
#[derive(Debug, thiserror::Error, Clone, PartialEq)]
#[non_exhaustive]
pub enum Error {
    /// A tensor has the wrong number of dimensions.
    #[error("{tensor} must have rank {expected}, got shape {got:?}")]
    Rank {
        /// The input's name as ONNX spells it (`Q`, `K`, `attn_mask`, ...).
        tensor: &'static str,
        /// The rank (or ranks, e.g. "1 to 4") the contract accepts.
        expected: &'static str,
        /// The shape the caller passed.
        got: Vec<usize>,
    },

    /// Two tensors disagree on a dimension they must share.
    #[error("{tensor} has {dim} = {got}, but {expected_from} says {expected}: {hint}")]
    ShapeMismatch {
        /// The tensor whose dimension is wrong.
        tensor: &'static str,
        /// Which dimension (e.g. "batch", "head size").
        dim: &'static str,
        /// The value found.
        got: usize,
        /// The value required.
        expected: usize,
        /// Where the required value comes from (e.g. "Q").
        expected_from: &'static str,
        /// What to change.
        hint: &'static str,
    },

    /// A tensor has a zero-sized dimension where the contract needs at least one element.
    #[error(
        "{tensor} has an empty dimension (shape {shape:?}); every dimension must be at least 1"
    )]
    EmptyTensor {
        /// The tensor's name.
        tensor: &'static str,
        /// Its shape.
        shape: Vec<usize>,
    },

    /// A tensor's data length does not match the product of its shape.
    #[error("{tensor} has shape {shape:?} ({expected} elements) but {got} values were given")]
    DataLength {
        /// The tensor's name.
        tensor: &'static str,
        /// Its declared shape.
        shape: Vec<usize>,
        /// The product of the shape.
        expected: usize,
        /// The number of values supplied.
        got: usize,
    },

    /// An element type the engine does not accept in this position.
    #[error("{tensor} has element type {got}; expected {expected}")]
    DType {
        /// The tensor's name.
        tensor: &'static str,
        /// The accepted element types.
        expected: &'static str,
        /// The element type found.
        got: String,
    },

    /// The attention mask's shape does not broadcast to `[B, Hq, Nq, T]`.
    #[error(
        "attn_mask of shape {mask:?} does not broadcast to [B, Hq, Nq, T] = {target:?}: {reason}"
    )]
    Broadcast {
        /// The mask's shape.
        mask: Vec<usize>,
        /// The full score shape `[B, Hq, Nq, T]`.
        target: [usize; 4],
        /// Which rule is broken.
        reason: String,
    },

    /// The query head count is not a multiple of the key/value head count.
    #[error(
        "grouped-query attention needs Hq to be a multiple of Hkv, got Hq = {q_heads}, Hkv = {kv_heads}; \
         use a KV head count that divides the query head count"
    )]
    GqaHeads {
        /// Query heads.
        q_heads: usize,
        /// Key/value heads.
        kv_heads: usize,
    },

    /// An option value outside its domain.
    #[error("option {name} = {value} is invalid: {reason}")]
    InvalidOption {
        /// The option's name as ONNX spells it.
        name: &'static str,
        /// The value given, as text.
        value: String,
        /// The accepted domain.
        reason: &'static str,
    },

    /// Inputs that the contract forbids together (or requires together).
    #[error("invalid combination of inputs: {0}")]
    Conflict(&'static str),

    /// The problem exceeds a limit of the adapter or of the engine.
    #[error("{what} needs {needed} but the limit is {limit} ({limit_name}): {hint}")]
    Limit {
        /// What would be allocated or dispatched.
        what: String,
        /// How much it needs.
        needed: u64,
        /// The limit's value on this adapter.
        limit: u64,
        /// The limit's name (e.g. `max_storage_buffer_binding_size`).
        limit_name: &'static str,
        /// What to do about it.
        hint: &'static str,
    },

    /// A tensor handle made by another engine (or another backend) was passed in.
    #[error(
        "{tensor} belongs to another engine; upload it with this engine (tensors are tied to one device)"
    )]
    ForeignTensor {
        /// The tensor's name.
        tensor: &'static str,
    },

    /// A buffer handed to [`crate::Engine::wrap_buffer`] was made on another
    /// wgpu device than the engine's: no kernel of this engine can read it.
    #[error(
        "{buffer} was made on another wgpu device than this engine's ({device}); wrap buffers \
         created with the device the engine runs on (the one given to Engine::from_wgpu)"
    )]
    ForeignBuffer {
        /// The buffer, as the caller handed it (its size and the tensor it was to hold).
        buffer: String,
        /// The engine's device: its adapter and backend.
        device: String,
    },

    /// No GPU adapter could be found, and the caller asked for a GPU.
    #[error(
        "no GPU adapter found ({0}); install a Vulkan, Metal, DX12 or GL driver \
         (on Debian: apt-get install mesa-vulkan-drivers libvulkan1), or use the CPU backend"
    )]
    NoAdapter(String),

    /// The adapter was found but refused to create a device.
    #[error("the adapter refused to create a device: {0}")]
    RequestDevice(String),

    /// The GPU device was lost (driver reset, removal, or destruction). The
    /// engine's next async call (or [`crate::Engine::recover`]) continues on a
    /// fresh device; tensors of the lost one must be uploaded again.
    #[error(
        "the GPU device was lost ({0}); the engine continues on a fresh device at its next \
         call: upload the tensors again"
    )]
    DeviceLost(String),

    /// A tensor lived on a GPU device that has since been lost; its values are gone.
    #[error(
        "{tensor} lived on a GPU device that was lost, and its values went with it; \
         upload it again (the engine now runs on a fresh device)"
    )]
    TensorLost {
        /// The tensor's name.
        tensor: &'static str,
    },

    /// The GPU ran out of memory (or, on a CPU engine, the host could not
    /// allocate what a call needed).
    #[error("out of memory while {0}; reduce the batch or sequence length")]
    OutOfMemory(String),

    /// wgpu reported an error that the engine's checks did not prevent.
    /// This is a bug in webattn: please report it with the message.
    #[error("internal GPU error in {kernel}: {message} (this is a webattn bug; please report it)")]
    Gpu {
        /// The pipeline key or step that failed.
        kernel: String,
        /// wgpu's message.
        message: String,
    },

    /// A paged KV cache was asked about a sequence it does not hold (never
    /// added, or freed), or a page outside its pool.
    #[error("paged KV cache: {what} {id} {reason}")]
    Paged {
        /// What was named: `sequence` or `page`.
        what: &'static str,
        /// Its number.
        id: u64,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// Reading a buffer back from the GPU failed.
    #[error("reading results back from the GPU failed: {0}")]
    Readback(String),

    /// A file could not be read or written, or is not a valid `.npy` file.
    #[error("{path}: {reason}")]
    File {
        /// The file's path.
        path: String,
        /// What is wrong, and what to do.
        reason: String,
    },

    /// A WGSL kernel failed to parse or validate.
    #[error("shader {kernel} failed validation:\n{message}")]
    Shader {
        /// The kernel's name.
        kernel: String,
        /// naga's message, with the source line.
        message: String,
    },
}

impl Error {
    /// The variant's name (`ShapeMismatch`, `Limit`, `DeviceLost`, ...): what
    /// kind of failure this is, for bindings that carry it apart from the
    /// message (the JavaScript library's `Error.name`).
    pub fn kind(&self) -> &'static str {
        match self {
            Error::Rank { .. } => "Rank",
            Error::ShapeMismatch { .. } => "ShapeMismatch",
            Error::EmptyTensor { .. } => "EmptyTensor",
            Error::DataLength { .. } => "DataLength",
            Error::DType { .. } => "DType",
            Error::Broadcast { .. } => "Broadcast",
            Error::GqaHeads { .. } => "GqaHeads",
            Error::InvalidOption { .. } => "InvalidOption",
            Error::Conflict(_) => "Conflict",
            Error::Limit { .. } => "Limit",
            Error::ForeignTensor { .. } => "ForeignTensor",
            Error::ForeignBuffer { .. } => "ForeignBuffer",
            Error::NoAdapter(_) => "NoAdapter",
            Error::RequestDevice(_) => "RequestDevice",
            Error::DeviceLost(_) => "DeviceLost",
            Error::TensorLost { .. } => "TensorLost",
            Error::OutOfMemory(_) => "OutOfMemory",
            Error::Gpu { .. } => "Gpu",
            Error::Paged { .. } => "Paged",
            Error::Readback(_) => "Readback",
            Error::File { .. } => "File",
            Error::Shader { .. } => "Shader",
        }
    }

    /// Builds a [`Error::Limit`] for a buffer larger than a binding or buffer limit.
    pub(crate) fn buffer_limit(
        what: impl Into<String>,
        needed: u64,
        limit: u64,
        limit_name: &'static str,
    ) -> Error {
        Error::Limit {
            what: what.into(),
            needed,
            limit,
            limit_name,
            hint: "use smaller tensors, or an adapter with larger limits",
        }
    }
}
