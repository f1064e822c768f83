use std::fmt;

/// Dimensions, outermost first (row-major: the last dimension is contiguous).
#[derive(Clone, PartialEq, Eq, Hash, Default)]
pub struct Shape(pub Vec<usize>);

impl Shape {
    pub fn new(dims: impl Into<Vec<usize>>) -> Self {
        Shape(dims.into())
    }
    pub fn dims(&self) -> &[usize] {
        &self.0
    }
    pub fn rank(&self) -> usize {
        self.0.len()
    }
    /// Number of elements (1 for a scalar), saturating rather than overflowing.
    pub fn numel(&self) -> usize {
        self.0.iter().fold(1usize, |a, &d| a.saturating_mul(d))
    }
    /// The last dimension (1 for a scalar).
    pub fn last(&self) -> usize {
        self.0.last().copied().unwrap_or(1)
    }
    /// Product of every dimension but the last: the number of rows.
    pub fn rows(&self) -> usize {
        match self.0.split_last() {
            Some((_, lead)) => lead.iter().fold(1usize, |a, &d| a.saturating_mul(d)),
            None => 1,
        }
    }
    pub fn dim(&self, i: usize) -> Option<usize> {
        self.0.get(i).copied()
    }
}

impl From<&[usize]> for Shape {
    fn from(d: &[usize]) -> Self {
        Shape(d.to_vec())
    }
}
impl<const N: usize> From<[usize; N]> for Shape {
    fn from(d: [usize; N]) -> Self {
        Shape(d.to_vec())
    }
}
impl From<Vec<usize>> for Shape {
    fn from(d: Vec<usize>) -> Self {
        Shape(d)
    }
}

impl fmt::Display for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[")?;
        for (i, d) in self.0.iter().enumerate() {
            if i > 0 {
                write!(f, ", ")?;
            }
            write!(f, "{d}")?;
        }
        write!(f, "]")
    }
}
impl fmt::Debug for Shape {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}
