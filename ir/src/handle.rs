//! Typed handles and the arena they index (naga `Handle<T>` / Cranelift entity style).

use std::fmt;
use std::marker::PhantomData;

/// A typed index into an [`Arena<T>`] of one kernel.
///
/// Handles are only meaningful for the kernel that created them; the verifier reports a handle
/// that is out of range for its arena.
pub struct Handle<T> {
    index: u32,
    marker: PhantomData<fn() -> T>,
}

impl<T> Handle<T> {
    /// Makes a handle from a raw index (used by the parser and by tests of the verifier).
    pub const fn from_index(index: u32) -> Self {
        Handle {
            index,
            marker: PhantomData,
        }
    }

    /// The raw index into the arena.
    pub const fn index(self) -> usize {
        self.index as usize
    }
}

impl<T> Clone for Handle<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for Handle<T> {}
impl<T> PartialEq for Handle<T> {
    fn eq(&self, other: &Self) -> bool {
        self.index == other.index
    }
}
impl<T> Eq for Handle<T> {}
impl<T> std::hash::Hash for Handle<T> {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.index.hash(state)
    }
}
impl<T> PartialOrd for Handle<T> {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl<T> Ord for Handle<T> {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.index.cmp(&other.index)
    }
}
impl<T> fmt::Debug for Handle<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}", self.index)
    }
}

/// A growable arena of `T`, addressed by [`Handle<T>`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Arena<T> {
    items: Vec<T>,
}

impl<T> Default for Arena<T> {
    fn default() -> Self {
        Arena { items: Vec::new() }
    }
}

impl<T> Arena<T> {
    /// An empty arena.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends `item` and returns its handle.
    pub fn append(&mut self, item: T) -> Handle<T> {
        let index = u32::try_from(self.items.len()).expect("arena holds at most u32::MAX items");
        self.items.push(item);
        Handle::from_index(index)
    }

    /// The item behind `handle`, or `None` when the handle is out of range.
    pub fn try_get(&self, handle: Handle<T>) -> Option<&T> {
        self.items.get(handle.index())
    }

    /// The item behind `handle`, mutably, or `None` when the handle is out of range.
    pub fn get_mut(&mut self, handle: Handle<T>) -> Option<&mut T> {
        self.items.get_mut(handle.index())
    }

    /// Number of items.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// True when the arena holds no item.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }

    /// Iterates over `(handle, item)` pairs in creation order.
    pub fn iter(&self) -> impl Iterator<Item = (Handle<T>, &T)> {
        self.items
            .iter()
            .enumerate()
            .map(|(i, t)| (Handle::from_index(i as u32), t))
    }
}

impl<T> std::ops::Index<Handle<T>> for Arena<T> {
    type Output = T;
    /// Panics on an out-of-range handle; only verified kernels are indexed this way.
    fn index(&self, handle: Handle<T>) -> &T {
        &self.items[handle.index()]
    }
}
