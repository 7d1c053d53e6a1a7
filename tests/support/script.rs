//! What a scripted fake does next: the scripted steps in order, then a standing one forever.

use std::collections::VecDeque;
use std::sync::Mutex;

pub struct Script<T> {
    next: Mutex<VecDeque<T>>,
    standing: Mutex<T>,
}

impl<T: Clone> Script<T> {
    pub fn new(steps: Vec<T>, standing: T) -> Self {
        Self {
            next: Mutex::new(steps.into()),
            standing: Mutex::new(standing),
        }
    }

    /// Take the next scripted step, or the standing one once the script is played out.
    pub fn next(&self) -> T {
        let scripted = self.next.lock().unwrap().pop_front();
        scripted.unwrap_or_else(|| self.standing.lock().unwrap().clone())
    }

    /// Play `steps` after those still scripted, before the standing one.
    pub fn extend(&self, steps: Vec<T>) {
        self.next.lock().unwrap().extend(steps);
    }

    pub fn set_standing(&self, step: T) {
        *self.standing.lock().unwrap() = step;
    }
}
