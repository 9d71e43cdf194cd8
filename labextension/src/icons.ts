/** The extension's icon, a LabIcon from style/icons/gpu.svg (follows the theme via jp-icon3). */
import { LabIcon } from '@jupyterlab/ui-components';
import gpuSvgStr from '../style/icons/gpu.svg';

export const gpuIcon = new LabIcon({ name: 'jupyter-gpujobs:gpu', svgstr: gpuSvgStr });
