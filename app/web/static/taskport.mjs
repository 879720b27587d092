// taskport.mjs: taskport.js as an ES module with named exports. The client itself is taskport.js
// (one file, also usable from a plain script tag); importing it here runs it once and re-exports it.
import "./taskport.js";

const taskport = globalThis.taskport;
export const {
  configure, submitTask, getTask, getResult, cancelTask, retryTask, listHistory, watchTask, TaskportError, TERMINAL,
  OUTCOMES, sseParser, createSchedule, listSchedules, getSchedule, updateSchedule, deleteSchedule,
  submitBatch, getBatch, listBatchTasks, watchBatch, cancelBatch, getResultFile, resultFileUrl, getOutput,
} = taskport;
export default taskport;
